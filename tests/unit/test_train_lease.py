"""A training job's lease: a renewal that keeps failing ends the lease before it expires,
tells training to stop, and the job goes back instead of running on beside a second worker.
(The real store's renewals are exercised by tests/integration/test_train_service.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from services.train.config import TrainConfig
from services.train.handlers import LeaseLostError, TrainHandlers
from shared.bus.delivery import HandlerContext
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Environment, TrainingJob
from shared.store.tenants import create_tenant


class UnreachableStore:
    """A store whose every transaction fails to connect, as when Postgres is down."""

    def __init__(self) -> None:
        self.attempts = 0

    @contextlib.asynccontextmanager
    async def tenant(self, tenant: str) -> AsyncIterator[None]:
        self.attempts += 1
        raise ConnectionRefusedError("connect call failed")
        yield


async def _beat() -> None:
    return None


def _context(store: object) -> HandlerContext:
    return HandlerContext("acme", None, "s", "m", 1, _beat, store)  # type: ignore[arg-type]


async def _forever(stopped: asyncio.Event) -> None:
    """Work that never ends by itself; `stopped` is set when it is cancelled."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stopped.set()
        raise


class Watch:
    """A job's cancel watch (`shared.progress.Tracker.watch`): never cancelled, unless told."""

    def __init__(self, cancelled_after_s: float | None = None) -> None:
        self.after = cancelled_after_s

    async def watch(self, every_s: float | None = None) -> None:
        if self.after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.after or 0)


async def test_a_lease_that_cannot_be_renewed_is_lost_before_it_expires() -> None:
    handlers = TrainHandlers(TrainConfig(lease_s=6))
    store = UnreachableStore()
    stop = threading.Event()
    started = time.monotonic()
    with pytest.raises(LeaseLostError, match="could not be renewed"):
        await asyncio.wait_for(handlers._renew(_context(store), uuid.uuid4(), stop, "mine"), 20)
    lost_after = time.monotonic() - started
    assert stop.is_set()  # training is told to stop
    assert 4.0 <= lost_after < 6.0  # after 2/3 of the lease, before another worker may claim
    assert store.attempts >= 3  # failed renewals are tried again, not given up at once


async def test_work_is_stopped_when_the_lease_is_lost() -> None:
    handlers = TrainHandlers(TrainConfig(lease_s=6))
    stopped = asyncio.Event()

    lease = asyncio.create_task(
        handlers._renew(_context(UnreachableStore()), uuid.uuid4(), threading.Event(), "mine")
    )
    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(handlers._guarded(_forever(stopped), lease, Watch()), 20)  # type: ignore[arg-type]
    assert stopped.is_set()


async def test_work_that_finishes_first_keeps_its_result_and_errors() -> None:
    handlers = TrainHandlers(TrainConfig(lease_s=6))

    async def fails() -> None:
        raise ValueError("planted")

    lease = asyncio.create_task(asyncio.sleep(3600))
    with pytest.raises(ValueError, match="planted"):
        await handlers._guarded(fails(), lease, Watch())  # type: ignore[arg-type]
    assert not lease.done()
    lease.cancel()


async def test_a_cancelled_job_stops_its_work_and_says_so() -> None:
    handlers = TrainHandlers(TrainConfig(lease_s=6))
    stopped = asyncio.Event()

    lease = asyncio.create_task(asyncio.sleep(3600))
    finished = await asyncio.wait_for(
        handlers._guarded(_forever(stopped), lease, Watch(cancelled_after_s=0.1)),  # type: ignore[arg-type]
        20,
    )
    assert finished is False and stopped.is_set() and not lease.done()
    lease.cancel()


async def test_a_lease_taken_over_by_another_delivery_is_lost_at_the_next_renewal(
    store: Store,
) -> None:
    """A delivery cut off from NATS keeps training while JetStream hands the job to another:
    its next renewal finds the claim's token replaced, and it stops."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="m", environment="toolbox")
        env = Environment(name="toolbox", version=1, kind="target", status="ready")
        session.add(env)
        await session.flush()
        job = TrainingJob(
            environment_id=env.id,
            status="running",
            config={"agent_id": str(agent.id), "claim": {"msg_id": "m", "token": "theirs"}},
        )
        session.add(job)
        await session.flush()
        job_id = job.id
    handlers = TrainHandlers(TrainConfig(lease_s=6))
    context = HandlerContext("acme", None, "s", "m", 1, _beat, store)
    stop = threading.Event()
    started = time.monotonic()
    with pytest.raises(LeaseLostError, match="took the job over"):
        await asyncio.wait_for(handlers._renew(context, job_id, stop, "mine"), 20)
    assert stop.is_set() and time.monotonic() - started < 3.0  # at the first renewal
