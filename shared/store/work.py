"""Cancelling a cycle, or one long job of it: what `retrace cancel` and the control API both
do (one code path). A cancelled cycle fails, saying so; its running jobs are flagged and
stop at their next episode or training step, leaving what they stored whole."""

from __future__ import annotations

import uuid

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from shared import cycle as machine
from shared.cycle import State
from shared.errors import PermanentError
from shared.store.models import Cycle, TrainingJob, Work


class NotCancellableError(PermanentError):
    """Nothing by that id can be cancelled (ended, not running, or unknown); says which."""


async def cancel(
    session: AsyncSession, target: uuid.UUID, by: str = "retrace cancel"
) -> tuple[str, list[uuid.UUID], Cycle | None]:
    """Cancel a cycle (it fails, saying so and `by` whom; its running jobs are flagged) or
    one job (a running rollout batch, training job or prompt optimisation, or a training job
    not started yet). Returns what was cancelled, the jobs flagged, and the cycle that
    ended."""
    cycle = await session.get(Cycle, target, with_for_update=True)
    if cycle is not None:
        if cycle.state in machine.ENDED:
            raise NotCancellableError(f"cycle {target} has already ended ({cycle.state})")
        machine.move(cycle, State.FAILED, machine.CANCEL)
        cycle.reason = cycle.error = f"cancelled ({by})"
        flagged = list(
            await session.scalars(
                update(Work)
                .where(Work.cycle_id == target, Work.state == "running")
                .values(cancel_requested=True)
                .returning(Work.id)
            )
        )
        return f"cycle {target}", flagged, cycle
    work = await session.get(Work, target, with_for_update=True)
    if work is not None:
        if work.state != "running":
            raise NotCancellableError(f"{work.kind} {target} is not running ({work.state})")
        work.cancel_requested = True
        return f"{work.kind} {target} ({work.label})", [target], None
    job = await session.get(TrainingJob, target)
    if job is not None and job.status == "queued":
        # not claimed yet: the worker that takes it finds it cancelled and ends it at once
        await session.execute(
            insert(Work)
            .values(
                id=job.id,
                tenant_id=job.tenant_id,
                kind="prompt" if job.config.get("kind") == "gepa" else "training",
                label="",
                cycle_id=job.cycle_id,
                done=0,
                total=0,
                unit="steps",
                state="running",
                cancel_requested=True,
            )
            .on_conflict_do_update(index_elements=[Work.id], set_={"cancel_requested": True})
        )
        return f"training job {target} (not started)", [target], None
    raise NotCancellableError(
        f"no active cycle, running job or pending training job {target} "
        "(see `retrace status` for the ids)"
    )
