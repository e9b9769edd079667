"""Progress and cancellation of long jobs, through one `work` row per job.

A long handler (a rollout batch, a training job, a prompt optimisation) runs inside
`async with Tracker(...) as work: await work.start(done)`, on its request's or job's id:
the row says what it is, how far it got (done of total) and since when, so `retrace
status` and every `--wait` can draw a bar with a rate and an ETA.
Each write is its own short transaction: the first unit done at once (a job shows it has
begun to move), then at most one every `every_s`, and the last one.

Cancellation goes the other way: `retrace cancel` sets the row's `cancel_requested` (or
ends the job's cycle); every write reads it back, and `Tracker.watch` polls it for work that
runs in a thread. Either way the job raises `Cancelled`, which the delivery acknowledges:
the message is dropped, not retried, not dead-lettered. What a job stored before that stays
whole (each trajectory commits on its own, a training step checkpoints whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from types import TracebackType
from typing import Literal

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert

from shared.cycle import ENDED
from shared.errors import Cancelled
from shared.store import Store
from shared.store.models import Cycle, Work

Kind = Literal["rollout", "training", "prompt"]


class Tracker:
    def __init__(
        self,
        store: Store,
        tenant: str,
        work_id: uuid.UUID,
        *,
        kind: Kind,
        total: int,
        label: str = "",
        unit: str = "episodes",
        cycle_id: uuid.UUID | None = None,
        every_s: float = 2.0,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.id = work_id
        self.kind = kind
        self.total = total
        self.label = label
        self.unit = unit
        self.cycle_id = cycle_id
        self.every_s = every_s
        self.done = 0
        self.final: str | None = None
        self._written = 0.0
        self._moved = False
        """A unit has been counted since the job started (its first is written at once)."""
        self._lock = asyncio.Lock()

    async def start(self, done: int = 0) -> Tracker:
        """Record the job as running from `done` (a resumed job starts where it was);
        `Cancelled` if it or its cycle was cancelled before it started."""
        self.done = done
        async with self.store.tenant(self.tenant) as session:
            if self.cycle_id is not None:
                state = await session.scalar(select(Cycle.state).where(Cycle.id == self.cycle_id))
                if state in ENDED:
                    raise Cancelled(f"{self.kind} {self.id}: its cycle has ended ({state})")
            values = {
                "kind": self.kind,
                "label": self.label,
                "cycle_id": self.cycle_id,
                "done": done,
                "total": self.total,
                "unit": self.unit,
                "state": "running",
            }
            cancelled = await session.scalar(
                insert(Work)
                .values(id=self.id, tenant_id=self.tenant, cancel_requested=False, **values)
                .on_conflict_do_update(index_elements=[Work.id], set_=values)
                .returning(Work.cancel_requested)
            )
        self._written = time.monotonic()
        if cancelled:
            raise Cancelled(f"{self.kind} {self.id} was cancelled")
        return self

    async def advance(self, n: int = 1) -> None:
        """Count `n` more done; written the first time, then at most every `every_s` (and
        when all are done). `Cancelled` when the job was cancelled meanwhile."""
        self.done += n
        first, self._moved = not self._moved, True
        if not first and self.done < self.total and time.monotonic() - self._written < self.every_s:
            return
        await self.set(self.done)

    async def set(self, done: int) -> None:
        """Write `done` now; `Cancelled` when the job was cancelled meanwhile."""
        async with self._lock:
            self.done = done
            if await self._write(done=done):
                await self._write(state="cancelled")
                raise Cancelled(f"{self.kind} {self.id} was cancelled")

    async def cancelled(self) -> bool:
        """Whether someone asked this job to stop (or its cycle has ended)."""
        async with self.store.tenant(self.tenant) as session:
            row = await session.execute(
                select(Work.cancel_requested, Cycle.state)
                .outerjoin(Cycle, Cycle.id == Work.cycle_id)
                .where(Work.id == self.id)
            )
            found = row.first()
        return found is not None and (bool(found[0]) or found[1] in ENDED)

    async def watch(self, every_s: float | None = None) -> None:
        """Return once the job is cancelled (for work that runs in a thread)."""
        while True:
            if await self.cancelled():
                return
            await asyncio.sleep(every_s or self.every_s)

    async def finish(self, state: Literal["finished", "stopped", "cancelled"]) -> None:
        """Record how the job ended (the block's end does not overwrite it)."""
        self.final = state
        await self._write(state=state)

    async def _write(self, **values: object) -> bool:
        async with self.store.tenant(self.tenant) as session:
            cancel = await session.scalar(
                update(Work)
                .where(Work.id == self.id)
                .values(updated_at=func.now(), **values)
                .returning(Work.cancel_requested)
            )
        self._written = time.monotonic()
        return bool(cancel)

    async def __aenter__(self) -> Tracker:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Finished when the block ended well, cancelled on `Cancelled`, else stopped (a
        failure or a shutdown hands the job back; its next delivery resumes it), unless the
        job said how it ended (`finish`)."""
        if self.final is not None:
            return
        if exc is None:
            await self.finish("finished")
        elif isinstance(exc, Cancelled):
            await self.finish("cancelled")
        else:
            with contextlib.suppress(Exception):  # the job's own failure is the one to report
                await asyncio.shield(self.finish("stopped"))


async def request_cancel(store: Store, tenant: str, work_ids: list[uuid.UUID]) -> int:
    """Flag these jobs for cancellation; how many running ones were flagged."""
    async with store.tenant(tenant) as session:
        flagged = await session.scalars(
            update(Work)
            .where(Work.id.in_(work_ids), Work.state == "running")
            .values(cancel_requested=True)
            .returning(Work.id)
        )
        return len(list(flagged))
