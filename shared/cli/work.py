"""Long jobs seen from the CLI: progress bars (`retrace status`, every `--wait`) and
`retrace cancel` (a cycle, or one job of it)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import click
import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.bus import NatsBus
from shared.cli.context import load_settings, make_console, open_store, urls
from shared.messages import CycleCompleted
from shared.store import work as store_work
from shared.store.models import Cycle, Work

console = make_console()


class WorkView(msgspec.Struct, kw_only=True):
    id: str
    kind: str
    label: str
    state: str
    done: int
    total: int
    unit: str
    elapsed_s: float
    rate_per_min: float | None
    """Since the job (or its latest resume) started; None before anything is done."""
    eta_s: float | None
    cycle: str | None = None
    tenant: str = ""
    cancel_requested: bool = False


def view(row: Work, now: datetime | None = None, resumed_from: int = 0) -> WorkView:
    now = now or datetime.now(UTC)
    elapsed = max((now - row.started_at).total_seconds(), 0.0)
    progressed = row.done - resumed_from
    rate = progressed / elapsed * 60 if progressed > 0 and elapsed > 0 else None
    left = max(row.total - row.done, 0)
    return WorkView(
        id=str(row.id),
        kind=row.kind,
        label=row.label,
        state=row.state,
        done=row.done,
        total=row.total,
        unit=row.unit,
        elapsed_s=round(elapsed, 1),
        rate_per_min=round(rate, 3) if rate is not None else None,
        eta_s=round(left / rate * 60, 1) if rate else None,
        cycle=str(row.cycle_id) if row.cycle_id else None,
        tenant=row.tenant_id,
        cancel_requested=row.cancel_requested,
    )


def bar(w: WorkView, width: int = 20) -> str:
    """One line: `[######--------------] 9/32 episodes  1.2/min  ETA 19m  rollout evaluate ...`."""
    filled = round(width * w.done / w.total) if w.total else 0
    parts = [f"[{'#' * filled}{'-' * (width - filled)}] {w.done}/{w.total} {w.unit}"]
    if w.rate_per_min is not None:
        parts.append(f"{w.rate_per_min:.2g}/min")
    if w.eta_s is not None:
        parts.append(f"ETA {_duration(w.eta_s)}")
    if w.cancel_requested and w.state == "running":
        parts.append("cancelling")
    parts.append(f"{w.kind} {w.label}".strip())
    return "  ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


async def running(session: AsyncSession, cycle_id: uuid.UUID | None = None) -> list[WorkView]:
    """The jobs under way (of one cycle, or all the session can see), oldest first."""
    query = select(Work).where(Work.state == "running").order_by(Work.started_at)
    if cycle_id is not None:
        query = query.where(Work.cycle_id == cycle_id)
    now = datetime.now(UTC)
    return [view(row, now) for row in await session.scalars(query)]


async def cancel(
    session: AsyncSession, target: uuid.UUID
) -> tuple[str, list[uuid.UUID], Cycle | None]:
    """`shared.store.work.cancel`, its refusal as the CLI's one-line error."""
    try:
        return await store_work.cancel(session, target)
    except store_work.NotCancellableError as exc:
        raise click.ClickException(str(exc)) from None


async def run_cancel(tenant: str, target: uuid.UUID) -> str:
    cfg = load_settings()
    async with open_store(cfg) as store, store.tenant(tenant) as session:
        what, flagged, ended = await cancel(session, target)
    if ended is not None:
        nats_url, _ = urls(cfg, start=False)
        if nats_url:  # followers learn it from the bus; the state is already in Postgres
            bus = await NatsBus.connect(nats_url, cfg.nats)
            try:
                await bus.publish(
                    tenant,
                    CycleCompleted(cycle_id=ended.id, outcome="failed", reason=ended.reason),
                    msg_id=f"cancelled/{ended.id}",
                )
            finally:
                await bus.close()
    return f"cancelled {what}; {len(flagged)} running job(s) told to stop"


@click.command("cancel")
@click.argument("target", type=click.UUID)
@click.option("--tenant", default="default", envvar="RETRACE_TENANT", show_default=True)
def cancel_command(target: uuid.UUID, tenant: str) -> None:
    """Cancel a cycle, or one running job of it (the ids are in `retrace status`). A job
    stops at its next episode or training step; what it stored stays whole."""
    console.print(asyncio.run(run_cancel(tenant, target)))
