"""`retrace synthesize`: build and calibrate a training environment for each capability the
agent's latest diagnosis kept, and show the result."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import click
from rich.markup import escape
from rich.table import Table
from sqlalchemy import select

from shared.bus import NatsBus
from shared.cli.capabilities import latest_capabilities
from shared.cli.context import load_settings, make_console, open_store, urls
from shared.cli.work import bar, running
from shared.config import ServiceConfig
from shared.errors import PermanentError
from shared.messages import CapabilitiesIdentified
from shared.store.agents import get_agent
from shared.store.models import Environment

console = make_console()
SETTLED = ("ready", "failed")


async def _environments(
    cfg: ServiceConfig, tenant: str, capability_ids: list[str]
) -> list[dict[str, Any]]:
    async with open_store(cfg) as store, store.tenant(tenant) as session:
        rows = await session.scalars(
            select(Environment)
            .where(
                Environment.kind == "synthetic",
                Environment.capability_id.in_([uuid.UUID(c) for c in capability_ids]),
            )
            .order_by(Environment.name, Environment.version)
        )
        return [
            {
                "name": r.name,
                "version": r.version,
                "status": r.status,
                "capability_id": str(r.capability_id),
                "calibration": r.calibration,
            }
            for r in rows
        ]


async def run_synthesize(
    cfg: ServiceConfig, tenant: str, agent_name: str, wait_s: float
) -> list[dict[str, Any]]:
    caps = [
        c for c in await latest_capabilities(cfg, tenant, agent_name) if c["statistics"].get("kept")
    ]
    if not caps:
        raise click.ClickException(
            f"no kept capabilities for {agent_name!r}: run `retrace diagnose` first"
        )
    nats_url, _ = urls(cfg, start=False)
    if not nats_url:
        raise click.ClickException("nothing is running: start the services first with `retrace up`")
    async with open_store(cfg) as store, store.tenant(tenant) as session:
        agent = await get_agent(session, agent_name)
    bus = await NatsBus.connect(nats_url, cfg.nats)
    try:
        await bus.publish(
            tenant,
            CapabilitiesIdentified(
                agent_id=agent.id,
                capability_ids=[uuid.UUID(c["id"]) for c in caps],
                request_id=uuid.UUID(caps[0]["evidence"]["request_id"]),
            ),
            msg_id=f"cli-synthesize/{uuid.uuid4()}",
        )
    finally:
        await bus.close()
    ids = [c["id"] for c in caps]
    deadline = time.monotonic() + wait_s
    title = f"synthesizing and calibrating {len(ids)} environments"
    with console.status(title) as status:
        while time.monotonic() < deadline:
            envs = await _environments(cfg, tenant, ids)
            done = {e["capability_id"] for e in envs if e["status"] in SETTLED}
            if done >= set(ids):
                return envs
            async with open_store(cfg) as store, store.tenant(tenant) as session:
                bars = [bar(w) for w in await running(session) if w.label.startswith("calibrate")]
            status.update(
                f"{title}: {len(done)} settled" + "".join(f"\n  {escape(b)}" for b in bars)
            )
            await asyncio.sleep(2.0)
    raise click.ClickException(
        "calibration did not finish in time: see `retrace status` for the queues"
    )


def print_environments(envs: list[dict[str, Any]]) -> None:
    table = Table(title="synthetic environments")
    for col in (
        "environment",
        "version",
        "status",
        "mean reward",
        "success",
        "informative",
        "why not",
    ):
        table.add_column(col)
    for e in envs:
        r = e["calibration"].get("result") or {}
        pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
        table.add_row(
            e["name"],
            str(e["version"]),
            e["status"],
            pct(r.get("mean_reward")),
            pct(r.get("success_rate")),
            pct(r.get("informative")),
            "; ".join(r.get("reasons", []))[:80],
        )
    console.print(table)


@click.command("synthesize")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option(
    "--wait", "wait_s", default=7200.0, show_default=True, help="Give up after this many seconds."
)
def synthesize(agent_name: str, tenant: str, wait_s: float) -> None:
    """Build a calibrated training environment for each capability of the latest diagnosis."""
    cfg = load_settings()
    try:
        envs = asyncio.run(run_synthesize(cfg, tenant, agent_name, wait_s))
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    print_environments(envs)
