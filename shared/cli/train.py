"""`retrace train` (one GRPO adapter per ready environment of the latest diagnosis, through
the train service's work queue) and `retrace adapters` (the agent's adapters and curves)."""

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
from shared.messages import TrainRequested
from shared.store.agents import get_agent
from shared.store.models import Adapter, Capability, Environment, TrainingJob

console = make_console()
FINISHED = ("done", "failed", "cancelled")


async def _ready_environments(
    cfg: ServiceConfig, tenant: str, agent_name: str
) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """(environment id, capability id, environment name@version) of the latest diagnosis's
    capabilities that have a ready environment (the newest version of each)."""
    caps = await latest_capabilities(cfg, tenant, agent_name)
    ids = [uuid.UUID(c["id"]) for c in caps if c["statistics"].get("kept")]
    if not ids:
        raise click.ClickException(
            f"no kept capabilities for {agent_name!r}: run `retrace diagnose` first"
        )
    out = []
    async with open_store(cfg) as store, store.tenant(tenant) as session:
        for capability_id in ids:
            env = await session.scalar(
                select(Environment)
                .where(Environment.capability_id == capability_id, Environment.status == "ready")
                .order_by(Environment.version.desc())
            )
            if env is not None:
                out.append((env.id, capability_id, f"{env.name}@{env.version}"))
    if not out:
        raise click.ClickException(
            f"no calibrated environment for {agent_name!r}: run `retrace synthesize` first"
        )
    return out


async def run_train(
    cfg: ServiceConfig, tenant: str, agent_name: str, budget: int | None, wait_s: float
) -> list[dict[str, Any]]:
    envs = await _ready_environments(cfg, tenant, agent_name)
    nats_url, _ = urls(cfg, start=False)
    if not nats_url:
        raise click.ClickException("nothing is running: start the services first with `retrace up`")
    jobs: list[uuid.UUID] = []
    async with open_store(cfg) as store:
        async with store.tenant(tenant) as session:
            agent = await get_agent(session, agent_name)
            for env_id, capability_id, _ in envs:
                config: dict[str, Any] = {"agent_id": str(agent.id)}
                if budget is not None:
                    config["rollout_budget"] = budget
                job = TrainingJob(environment_id=env_id, capability_id=capability_id, config=config)
                session.add(job)
                await session.flush()
                jobs.append(job.id)
        bus = await NatsBus.connect(nats_url, cfg.nats)
        try:
            for (env_id, capability_id, _), job_id in zip(envs, jobs, strict=True):
                await bus.publish(
                    tenant,
                    TrainRequested(
                        job_id=job_id, environment_id=env_id, capability_id=capability_id
                    ),
                    msg_id=f"cli-train/{job_id}",
                )
        finally:
            await bus.close()
        deadline = time.monotonic() + wait_s
        with console.status(f"training {len(jobs)} adapters") as status:
            while time.monotonic() < deadline:
                rows = await _jobs(store, tenant, jobs)
                async with store.tenant(tenant) as session:
                    bars = [bar(w) for w in await running(session) if uuid.UUID(w.id) in jobs]
                status.update(
                    f"training {len(jobs)} adapters" + "".join(f"\n  {escape(b)}" for b in bars)
                )
                if all(r["status"] in FINISHED for r in rows):
                    return rows
                await asyncio.sleep(2.0)
    raise click.ClickException("training did not finish in time: see `retrace status`")


async def _jobs(store: Any, tenant: str, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    async with store.tenant(tenant) as session:
        rows = []
        for job in await session.scalars(select(TrainingJob).where(TrainingJob.id.in_(ids))):
            capability = (
                await session.get(Capability, job.capability_id) if job.capability_id else None
            )
            adapter = await session.get(Adapter, job.adapter_id) if job.adapter_id else None
            progress = job.config.get("progress", {})
            rows.append(
                {
                    "job": str(job.id),
                    "capability": capability.name if capability else "-",
                    "status": job.status,
                    "step": progress.get("step", 0),
                    "rollouts": progress.get("rollouts", 0),
                    "adapter": adapter.name if adapter else None,
                    "curve": adapter.training_curve if adapter else [],
                    "error": job.error,
                }
            )
        return rows


def _curve_text(curve: list[dict[str, Any]]) -> str:
    if not curve:
        return "-"
    first, last = curve[0]["mean_reward"], curve[-1]["mean_reward"]
    return f"{first:.2f} -> {last:.2f} ({len(curve)} steps)"


def print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table(title="training jobs")
    for col in ("capability", "status", "steps", "rollouts", "mean reward", "adapter"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["capability"],
            r["status"],
            str(r["step"]),
            str(r["rollouts"]),
            _curve_text(r["curve"]),
            r["adapter"] or (r["error"] or "-")[:60],
        )
    console.print(table)


@click.command("train")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option(
    "--budget", type=int, default=None, help="Rollouts per adapter (default: the service's)."
)
@click.option(
    "--wait", "wait_s", default=14_400.0, show_default=True, help="Give up after this many seconds."
)
def train(agent_name: str, tenant: str, budget: int | None, wait_s: float) -> None:
    """Train one GRPO LoRA adapter per calibrated environment of the latest diagnosis."""
    if budget is not None and budget < 2:
        raise click.BadParameter(
            "a budget buys at least one group of 2 rollouts", param_hint="--budget"
        )
    cfg = load_settings()
    try:
        rows = asyncio.run(run_train(cfg, tenant, agent_name, budget, wait_s))
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    print_jobs(rows)


@click.command("adapters")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
def adapters(agent_name: str, tenant: str) -> None:
    """The agent's trained adapters: capability, status, whether the router serves it
    (production: promoted by a cycle), training curve, where they are."""
    cfg = load_settings()

    async def run() -> tuple[list[tuple[Adapter, str]], set[str]]:
        async with open_store(cfg) as store, store.tenant(tenant) as session:
            agent = await get_agent(session, agent_name)
            out = []
            for a in await session.scalars(
                select(Adapter).where(Adapter.agent_id == agent.id).order_by(Adapter.created_at)
            ):
                cap = await session.get(Capability, a.capability_id) if a.capability_id else None
                out.append((a, cap.name if cap else "-"))
            return out, {str(i) for i in agent.production_adapters or []}

    try:
        rows, production = asyncio.run(run())
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    if not rows:
        console.print(f"no adapters for {agent_name!r} yet: run `retrace train`")
        return
    table = Table(title=f"adapters of {agent_name}")
    for col in ("adapter", "capability", "status", "production", "mean reward", "rollouts", "path"):
        table.add_column(col)
    for a, cap in rows:
        curve = a.training_curve or []
        table.add_row(
            a.name,
            cap,
            a.status,
            "yes" if str(a.id) in production else "no",
            _curve_text(curve),
            str(curve[-1]["rollouts"] if curve else 0),
            a.artifact_uri,
        )
    console.print(table)
