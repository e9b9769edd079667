"""`retrace diagnose` (a diagnosis rollout, then contrast) and `retrace capabilities` (the table,
as JSON, and as a coverage-vs-delta plot)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import click
from nats.js.api import ConsumerConfig, DeliverPolicy
from rich.table import Table
from sqlalchemy import select

from shared.bus import NatsBus
from shared.bus.streams import stream_for
from shared.cli.context import load_settings, make_console, open_store, urls
from shared.cli.rollout import print_summary, run_rollout
from shared.config import ServiceConfig
from shared.errors import PermanentError
from shared.messages import CapabilitiesIdentified, Sampling, decode
from shared.store.agents import get_agent
from shared.store.models import Capability

console = make_console()


async def latest_capabilities(
    cfg: ServiceConfig, tenant: str, agent_name: str, request_id: uuid.UUID | None = None
) -> list[dict[str, Any]]:
    """The capabilities of the agent's latest diagnosis (or of `request_id`), kept ones first."""
    async with open_store(cfg) as store, store.tenant(tenant) as session:
        agent = await get_agent(session, agent_name)
        rows = list(
            await session.scalars(
                select(Capability)
                .where(Capability.agent_id == agent.id)
                .order_by(Capability.created_at.desc())
            )
        )
    if not rows:
        return []
    wanted = str(request_id) if request_id else rows[0].evidence.get("request_id")
    chosen = [r for r in rows if r.evidence.get("request_id") == wanted]
    chosen.sort(key=lambda r: (not r.statistics.get("kept"), -(r.statistics.get("delta") or -9)))
    return [
        {
            "id": str(r.id),
            "name": r.name,
            "status": r.status,
            "definition": r.definition,
            "statistics": r.statistics,
            "evidence": r.evidence,
            "created_at": r.created_at.isoformat(),
        }
        for r in chosen
    ]


def print_capabilities(caps: list[dict[str, Any]]) -> None:
    table = Table(title="capabilities (latest diagnosis)")
    for col in (
        "capability",
        "verdict",
        "status",
        "coverage",
        "delta (± sd)",
        "runs passed",
        "example failures",
    ):
        table.add_column(col)
    for c in caps:
        st = c["statistics"]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(
            c["name"],
            "[green]kept" if st.get("kept") else "rejected",
            c["status"],
            fmt(st.get("coverage")),
            f"{fmt(st.get('delta'))} ± {fmt(st.get('delta_std'))}",
            f"{st.get('runs_passed')}/{st.get('runs')}",
            ", ".join(c["evidence"].get("failed_examples", [])[:2]),
        )
    console.print(table)


def plot(caps: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for c in caps:
        st = c["statistics"]
        if st.get("coverage") is None or st.get("delta") is None:
            continue
        kept = bool(st.get("kept"))
        ax.errorbar(
            st["coverage"],
            st["delta"],
            yerr=st.get("delta_std") or 0,
            fmt="o",
            color="tab:green" if kept else "tab:gray",
        )
        ax.annotate(
            c["name"],
            (st["coverage"], st["delta"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.axvline(0.10, ls="--", lw=0.8, color="tab:red")
    ax.axhline(0.20, ls="--", lw=0.8, color="tab:red")
    ax.set_xlabel("coverage of failures (lacking in failed / failed)")
    ax.set_ylabel("delta (ER- minus ER+), mean ± sd over runs")
    ax.set_title("capabilities: kept (green) vs rejected (grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("capabilities")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write JSON."
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a coverage-vs-delta PNG.",
)
def capabilities(
    agent_name: str, tenant: str, json_path: Path | None, plot_path: Path | None
) -> None:
    """The capabilities found by the agent's latest diagnosis, with their statistics."""
    cfg = load_settings()
    try:
        caps = asyncio.run(latest_capabilities(cfg, tenant, agent_name))
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    if not caps:
        raise click.ClickException(
            f"no diagnosis for {agent_name!r} yet: run `retrace diagnose {agent_name}`"
        )
    print_capabilities(caps)
    if json_path:
        json_path.write_text(json.dumps(caps, indent=2))
    if plot_path:
        plot(caps, plot_path)


@click.command("diagnose")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option(
    "--tasks",
    "limit",
    type=int,
    default=None,
    help="Only this many train tasks (spread over kinds).",
)
@click.option("--trials", default=4, show_default=True, help="Episodes per task.")
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--max-tokens", default=256, show_default=True)
@click.option(
    "--wait",
    "wait_s",
    default=900.0,
    show_default=True,
    help="Give up after this many idle seconds.",
)
def diagnose(
    agent_name: str,
    tenant: str,
    limit: int | None,
    trials: int,
    temperature: float,
    max_tokens: int,
    wait_s: float,
) -> None:
    """Run a diagnosis rollout on the train split, then show the capabilities contrast found."""
    cfg = load_settings()

    async def run() -> list[dict[str, Any]]:
        nats_url, _ = urls(cfg, start=False)
        if not nats_url:
            raise click.ClickException(
                "nothing is running: start the services first with `retrace up`"
            )
        bus = await NatsBus.connect(nats_url, cfg.nats)
        try:
            # Listen before the rollout starts, so contrast's answer cannot be missed.
            answers = await bus.js.pull_subscribe(
                bus.subject(tenant, CapabilitiesIdentified),
                stream=stream_for(cfg.nats, CapabilitiesIdentified),
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, inactive_threshold=600),
            )
            request_id, summary = await run_rollout(
                cfg,
                agent_name=agent_name,
                tenant=tenant,
                env_ref=None,
                split="train",
                limit=limit,
                trials=trials,
                sampling=Sampling(temperature=temperature, max_tokens=max_tokens),
                adapter=None,
                wait_s=wait_s,
                purpose="diagnose",
            )
            print_summary(summary)
            deadline = time.monotonic() + wait_s
            with console.status("contrasting successes and failures"):
                while time.monotonic() < deadline:
                    try:
                        batch = await answers.fetch(10, timeout=2.0)
                    except TimeoutError:
                        continue
                    for m in batch:
                        await m.ack()
                        if decode(m.data, CapabilitiesIdentified).request_id == request_id:  # type: ignore[attr-defined]
                            return await latest_capabilities(cfg, tenant, agent_name, request_id)
        finally:
            await bus.close()
        raise click.ClickException("contrast did not finish: is the contrast service running?")

    try:
        caps = asyncio.run(run())
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    if caps:
        print_capabilities(caps)
    else:
        console.print("no candidate capability separates failures from successes in this rollout")
