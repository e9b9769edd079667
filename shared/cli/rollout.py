"""`retrace rollout`: ask the rollout service for episodes, follow them, print the summary."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import cast

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import func, select

from shared.bus import NatsBus
from shared.cli.context import load_settings, make_console, urls
from shared.config import ServiceConfig
from shared.envs.registry import canonical, get_environment
from shared.envs.selection import pick_tasks
from shared.errors import PermanentError
from shared.messages import Purpose, RolloutRequested, Sampling, Split
from shared.reports import RolloutSummary, summarise_request
from shared.store import Store
from shared.store.agents import get_agent
from shared.store.models import Trajectory

console = make_console()


async def run_rollout(
    cfg: ServiceConfig,
    *,
    agent_name: str,
    tenant: str,
    env_ref: str | None,
    split: str | None,
    limit: int | None,
    trials: int,
    sampling: Sampling,
    adapter: str | None,
    wait_s: float,
    purpose: Purpose = "adhoc",
) -> tuple[uuid.UUID, RolloutSummary]:
    """Publish a rollout request, follow it to the end; returns its id and summary."""
    nats_url, db_url = urls(cfg, start=False)
    if not nats_url or not db_url:
        raise click.ClickException("nothing is running: start the services first with `retrace up`")
    store = Store.connect(cfg.database, db_url)
    bus = await NatsBus.connect(nats_url, cfg.nats)
    try:
        async with store.tenant(tenant) as session:
            agent = await get_agent(session, agent_name)
        env = get_environment(env_ref or agent.environment)
        tasks = pick_tasks([t for t in env.tasks() if split is None or t.split == split], limit)
        if not tasks:
            raise click.ClickException(f"{env.name} has no {split or ''} tasks")
        request_id = uuid.uuid4()
        total = len(tasks) * trials
        await bus.publish(
            tenant,
            RolloutRequested(
                request_id=request_id,
                agent_id=agent.id,
                environment=env.name,
                split=cast(Split | None, split),
                task_ids=[t.id for t in tasks],
                trials=trials,
                sampling=sampling,
                adapter=adapter,
                purpose=purpose,
            ),
            msg_id=f"cli/{request_id}",
        )
        console.print(f"rollout {request_id}: {len(tasks)} {env.name} tasks x {trials} trials")
        await _follow(store, tenant, request_id, total, wait_s)
        async with store.tenant(tenant) as session:
            return request_id, await summarise_request(session, request_id)
    finally:
        await bus.close()
        await store.close()


async def _follow(
    store: Store, tenant: str, request_id: uuid.UUID, total: int, wait_s: float
) -> None:
    columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    last_change, seen = time.monotonic(), 0
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("episodes", total=total)
        while seen < total:
            async with store.tenant(tenant) as session:
                count = (
                    await session.scalar(
                        select(func.count())
                        .select_from(Trajectory)
                        .where(Trajectory.request_id == request_id)
                    )
                    or 0
                )
            if count != seen:
                seen, last_change = count, time.monotonic()
                progress.update(bar, completed=seen)
            elif time.monotonic() - last_change > wait_s:
                raise click.ClickException(
                    f"no episode finished in {wait_s:.0f}s: is the rollout service running "
                    "(`retrace status`) and the model endpoint up (`retrace serve-model`)?"
                )
            await asyncio.sleep(1.0)


def print_summary(summary: RolloutSummary) -> None:
    table = Table(title="rollout summary")
    for col in ("tasks", "episodes", "pass rate", "95% CI", "mean reward"):
        table.add_column(col, justify="right" if col != "tasks" else "left")
    for rate in [*summary.by_kind, summary.overall]:
        table.add_row(
            rate.label,
            str(rate.episodes),
            f"{rate.pass_rate:.1%}",
            f"[{rate.ci_low:.1%}, {rate.ci_high:.1%}]",
            f"{rate.mean_reward:.3f}",
        )
    console.print(table)
    if len(summary.pass_hat_k) > 1:
        console.print(
            "pass^k: " + ", ".join(f"k={k}: {v:.1%}" for k, v in summary.pass_hat_k.items())
        )
    if summary.errors:
        console.print(f"[yellow]{summary.errors} episodes ended on a model or environment error")
    if summary.env_errors:
        console.print(
            f"[yellow]{summary.env_errors} of them the environment broke: stored ungraded and "
            "left out of the rates above"
        )


@click.command("rollout")
@click.argument("agent_name")
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
@click.option("--env", "env_ref", default=None, help="Environment (default: the agent's).")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True)
@click.option(
    "--tasks", "limit", type=int, default=None, help="Only this many tasks (spread over kinds)."
)
@click.option("--trials", default=1, show_default=True, help="Episodes per task.")
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--max-tokens", default=512, show_default=True, help="Per model reply.")
@click.option("--seed", type=int, default=None, help="Sampling seed (trials get distinct seeds).")
@click.option(
    "--adapter", default=None, help="Serve with this LoRA adapter instead of the base model."
)
@click.option(
    "--wait",
    "wait_s",
    default=900.0,
    show_default=True,
    help="Give up after this many idle seconds.",
)
def rollout(
    agent_name: str,
    tenant: str,
    env_ref: str | None,
    split: str,
    limit: int | None,
    trials: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int | None,
    adapter: str | None,
    wait_s: float,
) -> None:
    """Run an agent on its environment's tasks through the rollout service and summarise."""
    cfg = load_settings()
    sampling = Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
    try:
        _, summary = asyncio.run(
            run_rollout(
                cfg,
                agent_name=agent_name,
                tenant=tenant,
                env_ref=canonical(env_ref) if env_ref else None,
                split=split,
                limit=limit,
                trials=trials,
                sampling=sampling,
                adapter=adapter,
                wait_s=wait_s,
            )
        )
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    print_summary(summary)
