"""Progress rows and cancellation (`shared/progress.py`, `shared/cli/work.py`) on Postgres."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import click
import pytest

from shared.cli.work import bar, cancel, running, view
from shared.errors import Cancelled
from shared.progress import Tracker
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Cycle, Work
from shared.store.tenants import create_tenant


@pytest.fixture
async def cycle_id(store: Store) -> uuid.UUID:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        cycle = Cycle(agent_id=agent.id, state="evaluating")
        session.add(cycle)
        await session.flush()
        return cycle.id


async def _row(store: Store, work_id: uuid.UUID) -> Work:
    async with store.tenant("acme") as session:
        row = await session.get(Work, work_id)
    assert row is not None
    return row


async def test_progress_is_written_and_a_finished_block_says_so(
    store: Store, cycle_id: uuid.UUID
) -> None:
    work_id = uuid.uuid4()
    async with Tracker(
        store, "acme", work_id, kind="rollout", total=4, label="evaluate toolbox",
        cycle_id=cycle_id, every_s=3600,
    ) as work:  # fmt: skip
        await work.start(1)  # a resumed batch: one episode was stored before
        assert (await _row(store, work_id)).done == 1
        await work.advance()  # the first since the start: written at once
        assert (await _row(store, work_id)).done == 2
        await work.advance()  # throttled: not written yet
        assert (await _row(store, work_id)).done == 2
        await work.advance()  # all done: written at once
        assert (await _row(store, work_id)).done == 4
        async with store.tenant("acme") as session:
            [shown] = await running(session, cycle_id)
        assert shown.id == str(work_id) and shown.total == 4
    row = await _row(store, work_id)
    assert (row.state, row.done, row.total, row.cycle_id) == ("finished", 4, 4, cycle_id)


async def test_a_failure_hands_the_work_back_as_stopped(store: Store, cycle_id: uuid.UUID) -> None:
    work_id = uuid.uuid4()
    with pytest.raises(RuntimeError):
        async with Tracker(store, "acme", work_id, kind="training", total=8) as work:
            await work.start()
            raise RuntimeError("the model server went away")
    assert (await _row(store, work_id)).state == "stopped"


async def test_a_cancelled_job_learns_it_on_its_next_write(
    store: Store, cycle_id: uuid.UUID
) -> None:
    work_id = uuid.uuid4()
    with pytest.raises(Cancelled):
        async with Tracker(store, "acme", work_id, kind="rollout", total=10, every_s=0) as work:
            await work.start()
            await work.advance()
            async with store.tenant("acme") as session:
                what, flagged, ended = await cancel(session, work_id)
            assert flagged == [work_id] and ended is None and "rollout" in what
            assert await work.cancelled()
            await work.advance()
    row = await _row(store, work_id)
    assert row.state == "cancelled" and row.done == 2
    async with store.tenant("acme") as session:
        with pytest.raises(click.ClickException, match="not running"):
            await cancel(session, work_id)


async def test_cancelling_a_cycle_fails_it_and_flags_its_running_jobs(
    store: Store, cycle_id: uuid.UUID
) -> None:
    mine, other = uuid.uuid4(), uuid.uuid4()
    ours = Tracker(store, "acme", mine, kind="rollout", total=3, cycle_id=cycle_id)
    theirs = Tracker(store, "acme", other, kind="rollout", total=3)
    await ours.start()
    await theirs.start()
    async with store.tenant("acme") as session:
        what, flagged, ended = await cancel(session, cycle_id)
    assert what == f"cycle {cycle_id}" and flagged == [mine]
    assert ended is not None and ended.state == "failed" and "cancelled" in ended.reason
    assert await ours.cancelled() and not await theirs.cancelled()
    # a job of the ended cycle that had not started yet never starts
    late = Tracker(store, "acme", uuid.uuid4(), kind="rollout", total=3, cycle_id=cycle_id)
    with pytest.raises(Cancelled, match="cycle has ended"):
        await late.start()
    async with store.tenant("acme") as session:
        with pytest.raises(click.ClickException, match="already ended"):
            await cancel(session, cycle_id)
        with pytest.raises(click.ClickException, match="no active cycle"):
            await cancel(session, uuid.uuid4())


def test_a_bar_shows_done_rate_and_eta() -> None:
    now = datetime.now(UTC)
    row = Work(
        id=uuid.uuid4(), tenant_id="acme", kind="rollout", label="evaluate toolbox", done=8,
        total=32, unit="episodes", state="running", cancel_requested=False,
        started_at=now - timedelta(minutes=4), cycle_id=None,
    )  # fmt: skip
    shown = view(row, now)
    assert shown.rate_per_min == 2.0 and shown.eta_s == 720.0
    assert bar(shown, width=8) == (
        "[##------] 8/32 episodes  2/min  ETA 12m  rollout evaluate toolbox"
    )
    row.done = 0
    assert "ETA" not in bar(view(row, now))
