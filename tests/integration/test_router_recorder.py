"""The router's recorder on a real Postgres: a batch of many tenants' turns written with a
handful of statements, conversations whose turns arrive in one batch written as one, a
conversation another process moved on kept as a branch, a turn the store refuses lost alone,
and a retried write of new conversations not written twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from services.router.conversations import Known, tip
from services.router.recorder import Answered, Opening, Recorder, Turn, keep, write_batch
from shared.config import DatabaseConfig
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.engine import application_name
from shared.store.models import Conversation, Trajectory
from shared.store.tenants import create_tenant

pytestmark = pytest.mark.timeout(60)


async def _agent(store: Store, tenant: str) -> uuid.UUID:
    async with store.cross_tenant() as session:
        await create_tenant(session, tenant)
    async with store.tenant(tenant) as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        return agent.id


def _history(opening: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages += [
            {"role": "user", "content": opening if n == 0 else f"and then {n}"},
            {"role": "assistant", "content": f"reply {n}"},
        ]
    return messages


def _turns(tenant: str, agent_id: uuid.UUID, opening: str, turns: int) -> list[Answered]:
    """A new conversation's first `turns` turns, each as the router hands it over."""
    known = Known(uuid.uuid4(), agent_id, None, None, {"mode": "test"}, "", 0)
    out = []
    found = ""
    for n in range(1, turns + 1):
        messages = _history(opening, n)
        first = Opening(agent_id, None, None, {"mode": "test"}) if n == 1 else None
        turn = Turn(tenant, known, found, n - 1, opening=first)
        out.append(Answered(turn, "smollm2", messages, tip(messages), 3, 10.0))
        found = tip(messages)
    return out


@contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(str(args[2]).split()[0])

    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", count)


async def _write(store: Store, tenant: str, turns: list[Answered]) -> None:
    """`turns` written as the recorder writes a batch: its statements outside a transaction,
    then what does not fit them by `keep`."""
    async with store.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        apart = await write_batch(conn, tenant, turns)
    async with store.tenant(tenant) as session:
        for answered in apart:
            await keep(session, answered)


async def _conversations(store: Store, tenant: str) -> dict[uuid.UUID, Conversation]:
    async with store.tenant(tenant) as session:
        return {c.id: c for c in await session.scalars(select(Conversation))}


async def _trajectory(store: Store, tenant: str, conversation: Conversation) -> Trajectory:
    async with store.tenant(tenant) as session:
        found = await session.get(Trajectory, conversation.trajectory_id)
        assert found is not None
        return found


async def test_a_batch_of_many_turns_takes_a_few_statements_and_loses_none(
    store: Store,
) -> None:
    a, b = await _agent(store, "acme"), await _agent(store, "globex")
    recorder = Recorder(store, limit=1000)
    # 40 new conversations of two tenants, interleaved, then one of each goes on for two
    # more turns in the same batch, and one answered earlier goes on
    earlier = _turns("acme", a, "written before", 2)
    earlier[1].messages[-2]["content"] = "a NUL \x00 in a continued turn"
    recorder.start()
    recorder.submit(earlier[0])
    await recorder.flush()
    batch = []
    for n in range(20):
        batch += [*_turns("acme", a, f"acme {n}", 1), *_turns("globex", b, f"globex {n}", 1)]
    long_a, long_b = _turns("acme", a, "three turns", 3), _turns("globex", b, "two", 2)
    batch += [*long_a, *long_b, earlier[1]]
    with _statements(store) as seen:
        for answered in batch:
            recorder.submit(answered)
        await recorder.flush()
    # one statement a kind and tenant, whatever the number of turns: acme's new
    # conversations with their trajectories, acme's earlier one moved on with its trajectory,
    # globex's new ones (was six: one a table and kind)
    assert len(seen) == 3, seen
    acme, globex = await _conversations(store, "acme"), await _conversations(store, "globex")
    assert (len(acme), len(globex)) == (22, 21)
    three = acme[long_a[0].turn.conversation_id]
    assert (three.turns, three.tip) == (3, long_a[-1].tip)
    kept = await _trajectory(store, "acme", three)
    assert kept.messages == long_a[-1].messages
    assert (kept.tokens, kept.latency_ms) == (9, 30.0)
    on = acme[earlier[1].turn.conversation_id]
    assert (on.turns, on.tip) == (2, earlier[1].tip)
    stored = (await _trajectory(store, "acme", on)).messages
    assert stored[-2]["content"] == "a NUL \ufffd in a continued turn"
    assert stored[:-2] == earlier[1].messages[:-2]
    two = globex[long_b[0].turn.conversation_id]
    assert (two.turns, (await _trajectory(store, "globex", two)).tokens) == (2, 6)
    await recorder.close(1.0)


async def test_a_conversation_moved_on_elsewhere_keeps_this_turn_as_a_branch(
    store: Store,
) -> None:
    agent = await _agent(store, "acme")
    first, second = _turns("acme", agent, "hello", 2)
    await _write(store, "acme", [first])
    # another router process answered a different second turn meanwhile
    elsewhere = [*_history("hello", 1), {"role": "user", "content": "other"}]
    elsewhere.append({"role": "assistant", "content": "other reply"})
    async with store.tenant("acme") as session:
        row = await session.get(Conversation, first.turn.conversation_id)
        assert row is not None
        row.tip = tip(elsewhere)
    await _write(store, "acme", [second])
    rows = await _conversations(store, "acme")
    assert len(rows) == 2
    [branch] = [c for c in rows.values() if c.id != first.turn.conversation_id]
    assert branch.route["branch_of"] == str(first.turn.conversation_id)
    assert branch.branch_of == first.turn.conversation_id
    assert branch.tip == second.tip
    assert (await _trajectory(store, "acme", branch)).messages == second.messages


async def test_a_branch_found_only_in_the_store_takes_its_later_turns_and_replays_once(
    store: Store,
) -> None:
    """Session 32's review: two router processes answered turns 2a and 2b of one
    conversation at once. 2b, written second, became a branch; but its process had moved the
    conversation on to 2b in memory, so 3b and 4b each found the conversation elsewhere and
    each made a branch of its own, the history again (three branches, each a prefix of the
    next). And a journal replayed after a crash made a branch of 2b once more."""
    agent = await _agent(store, "acme")
    first, _ = _turns("acme", agent, "hello", 2)
    await _write(store, "acme", [first])
    known = first.turn.known

    def turn(history: list[dict[str, Any]], text: str) -> Answered:
        messages = [*history, {"role": "user", "content": text}]
        messages.append({"role": "assistant", "content": f"re {text}"})
        turns = len(history) // 2
        t = Turn("acme", known, tip(history), turns)
        return Answered(t, "smollm2", messages, tip(messages), 3, 10.0)

    two_a = turn(first.messages, "2a")
    two_b = turn(first.messages, "2b")
    three_b = turn(two_b.messages, "3b")
    four_b = turn(three_b.messages, "4b")
    for answered in (two_a, two_b, three_b, four_b):
        await _write(store, "acme", [answered])
    rows = await _conversations(store, "acme")
    assert len(rows) == 2, [r.route for r in rows.values()]
    [branch] = [c for c in rows.values() if c.id != known.id]
    assert branch.branch_of == known.id and branch.route["branch_of"] == str(known.id)
    assert branch.tip == four_b.tip and branch.turns == 4
    assert (await _trajectory(store, "acme", branch)).messages == four_b.messages
    assert (await _trajectory(store, "acme", rows[known.id])).messages == two_a.messages
    # the journal replayed: nothing is written twice
    for replayed in ([two_b], [two_a, two_b, three_b], [first, two_a, two_b, three_b, four_b]):
        await _write(store, "acme", replayed)
    assert len(await _conversations(store, "acme")) == 2


async def test_a_turn_the_store_refuses_is_lost_alone(store: Store) -> None:
    agent = await _agent(store, "acme")
    good = [t for n in range(5) for t in _turns("acme", agent, f"good {n}", 1)]
    [bad] = _turns("acme", agent, "bad", 1)
    assert bad.turn.opening is not None
    bad.turn.opening = Opening(agent, None, uuid.uuid4(), {})  # a key that does not exist
    recorder = Recorder(store, limit=100)
    recorder.start()
    for answered in [*good[:2], bad, *good[2:]]:
        recorder.submit(answered)
    await recorder.flush()
    rows = await _conversations(store, "acme")
    assert set(rows) == {t.turn.conversation_id for t in good}
    await recorder.close(1.0)


async def test_new_conversations_written_twice_are_kept_once(store: Store) -> None:
    """A write whose commit was not heard of is tried again: it must not duplicate."""
    agent = await _agent(store, "acme")
    batch = [t for n in range(3) for t in _turns("acme", agent, f"n {n}", 1)]
    for _ in range(2):
        await _write(store, "acme", batch)
    async with store.tenant("acme") as session:
        assert await session.scalar(select(func.count()).select_from(Conversation)) == 3
        assert await session.scalar(select(func.count()).select_from(Trajectory)) == 3


async def test_a_batch_statement_that_cannot_compile_falls_back_and_loses_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the batched statements (seen: a bind name SQLAlchemy reserves) was retried
    as if the store were down, forever, and every later turn waited behind it. It is now
    written turn by turn instead, and the recorder goes on."""
    from sqlalchemy.exc import CompileError

    from services.router import recorder as module

    async def broken(*_: Any) -> list[Answered]:
        raise CompileError("a statement of ours that is wrong")

    monkeypatch.setattr(module, "write_batch", broken)
    agent = await _agent(store, "acme")
    turns = [t for n in range(3) for t in _turns("acme", agent, f"n {n}", 2)]
    recorder = Recorder(store, limit=100)
    recorder.start()
    for answered in turns:
        recorder.submit(answered)
    async with asyncio.timeout(20):
        await recorder.flush()
    rows = await _conversations(store, "acme")
    assert sorted(c.turns for c in rows.values()) == [2, 2, 2]
    await recorder.close(1.0)


async def test_flush_waits_for_the_batch_being_written(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch used to leave the queue before it was written: `flush` (feedback) returned at
    once and `close` stopped the writer mid-write without a word."""
    from services.router import recorder as module

    entered, release = asyncio.Event(), asyncio.Event()
    real = module.write_batch

    async def slow(*args: Any) -> list[Answered]:
        entered.set()
        await release.wait()
        return await real(*args)

    monkeypatch.setattr(module, "write_batch", slow)
    agent = await _agent(store, "acme")
    recorder = Recorder(store, limit=100)
    recorder.start()
    [turn] = _turns("acme", agent, "hello", 1)
    recorder.submit(turn)
    await entered.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await recorder.flush()
    release.set()
    async with asyncio.timeout(10):
        await recorder.flush()
    assert set(await _conversations(store, "acme")) == {turn.turn.conversation_id}
    await recorder.close(1.0)


async def test_a_replayed_turn_its_conversation_went_past_is_not_a_branch(store: Store) -> None:
    """A spool replayed after a router died between the commit and the delete: its earlier
    turns are already in the store, and their conversation has moved on. They must not come
    back as branches (duplicate trajectories, training data counted twice)."""
    agent = await _agent(store, "acme")
    turns = _turns("acme", agent, "hello", 3)
    await _write(store, "acme", turns)
    for replayed in ([turns[1]], [turns[0], turns[1]], turns):
        await _write(store, "acme", replayed)
    rows = await _conversations(store, "acme")
    assert len(rows) == 1
    [row] = rows.values()
    assert row.turns == 3 and row.tip == turns[-1].tip
    assert (await _trajectory(store, "acme", row)).messages == turns[-1].messages


async def test_a_new_conversation_of_another_tenant_s_agent_is_not_written(store: Store) -> None:
    """The batched insert reads agents and adapters inside its own select, which the session's
    tenant filter does not reach: another tenant's agent (or adapter) is not one this tenant
    can write a conversation for."""
    mine, theirs = await _agent(store, "acme"), await _agent(store, "globex")
    recorder = Recorder(store, limit=100)
    recorder.start()
    [foreign] = _turns("acme", theirs, "an agent of globex's", 1)
    [own] = _turns("acme", mine, "my own agent", 1)
    recorder.submit(foreign)
    recorder.submit(own)
    await recorder.flush()
    await recorder.close(1.0)
    assert list(await _conversations(store, "acme")) == [own.turn.conversation_id]
    assert list(await _conversations(store, "globex")) == []


async def test_turns_taken_back_from_the_spool_stop_counting_once_written(
    store: Store, tmp_path: Path
) -> None:
    """The limit counts only new turns, so replayed ones raise it while they wait; once
    written they counted on for the life of the process (the limit stayed raised)."""
    from services.router.spool import Spool

    agent = await _agent(store, "acme")
    Spool(tmp_path).put([t for n in range(3) for t in _turns("acme", agent, f"spooled {n}", 1)])
    recorder = Recorder(store, limit=2, spool=Spool(tmp_path))
    recorder.start()
    await recorder.flush()
    assert recorder.reserve() and recorder.reserve()
    assert not recorder.reserve()  # the limit is 2 again, not 5
    recorder.release()
    recorder.release()
    await recorder.close(1.0)


async def _tenant_index_reads(store: Store) -> int:
    """Index entries read so far through the conversations' tenant indexes (as counted when
    the last transaction ended)."""
    async with store.cross_tenant() as session:
        await session.execute(text("SELECT pg_stat_clear_snapshot()"))
        reads = await session.scalar(
            text(
                "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
                " WHERE schemaname = current_schema() AND relname = 'conversations'"
                " AND indexrelname LIKE 'ix_conversations_tenant_id%'"
            )
        )
        return int(reads or 0)


async def _written_and_counted(store: Store, answered: Answered) -> None:
    """`answered` written, its connection's counts of index reads flushed once it is (a
    backend sends them on its own only now and then)."""
    async with store.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        assert await write_batch(conn, "acme", [answered]) == []
        await conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")


async def test_moving_conversations_on_reads_their_rows_only_after_the_table_grew(
    store: Store,
) -> None:
    """Postgres keeps a generic plan for a statement prepared five times: made while the
    table was nearly empty, the batch update of continued conversations went through the
    tenant's index and read every conversation of the tenant at each batch (17 ms a batch
    at 20,000 conversations, most of the store's time under the router's load)."""
    agent = await _agent(store, "acme")
    for n in range(8):  # the table small: the statement planned and cached
        first, second = _turns("acme", agent, f"early {n}", 2)
        for answered in (first, second):
            await _write(store, "acme", [answered])
    async with store.tenant("acme") as session:
        await session.execute(
            text(
                "INSERT INTO trajectories (id, tenant_id, agent_id, trial, source, model,"
                " messages, reward_breakdown, tokens, latency_ms)"
                " SELECT md5(i::text)::uuid, 'acme', :agent, 0, 'production', 'm', '[]',"
                " '{}', 0, 0 FROM generate_series(1, 20000) i"
            ),
            {"agent": agent},
        )
        await session.execute(
            text(
                "INSERT INTO conversations (id, tenant_id, agent_id, trajectory_id, tip,"
                " route, turns) SELECT md5('c' || i)::uuid, 'acme', :agent,"
                " md5(i::text)::uuid, md5('t' || i), '{}', 1 FROM generate_series(1, 20000) i"
            ),
            {"agent": agent},
        )
    first, second = _turns("acme", agent, "late", 2)
    await _written_and_counted(store, first)
    before = await _tenant_index_reads(store)
    await _written_and_counted(store, second)
    assert await _tenant_index_reads(store) - before < 100
    rows = await _conversations(store, "acme")
    assert rows[second.turn.conversation_id].tip == second.tip


async def test_a_turn_naming_another_tenant_s_conversation_does_not_move_it(
    store: Store,
) -> None:
    """The batched statements run outside the session's tenant scope, so each names its
    tenant: a turn of acme's that carries the id and tip of globex's conversation must leave
    that conversation and its trajectory as they were."""
    await _agent(store, "acme")
    theirs = await _agent(store, "globex")
    [opened] = _turns("globex", theirs, "globex's own", 1)
    await _write(store, "globex", [opened])
    [before] = (await _conversations(store, "globex")).values()
    history = [*opened.messages, {"role": "user", "content": "acme's turn"}]
    history.append({"role": "assistant", "content": "acme's reply"})
    intruder = Turn("acme", opened.turn.known, opened.tip, 1)
    await _write(store, "acme", [Answered(intruder, "smollm2", history, tip(history), 3, 1.0)])
    [after] = (await _conversations(store, "globex")).values()
    assert (after.tip, after.turns) == (before.tip, before.turns)
    assert (await _trajectory(store, "globex", after)).messages == opened.messages
    assert await _conversations(store, "acme") == {}


class _Log:
    """The recorder's logger, keeping what it was told."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def _keep(self, event: str, **_: Any) -> None:
        self.events.append(event)

    info = warning = error = exception = _keep


async def test_a_connection_postgres_dropped_between_batches_is_replaced_at_once(
    store: Store, db_cfg: DatabaseConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are written on one connection held between them (no checkout, no ping). When
    Postgres drops it meanwhile (a restart), the next batch goes on a new connection at
    once, not after a failed write and the backoff."""
    from services.router import recorder as module

    log = _Log()
    monkeypatch.setattr(module, "log", log)
    agent = await _agent(store, "acme")
    first, second = _turns("acme", agent, "hello", 2)
    recorder = Recorder(store, limit=100)
    recorder.start()
    recorder.submit(first)
    await recorder.flush()
    async with store.cross_tenant() as session:
        dropped = await session.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name = :name"
            ),
            {"name": application_name(db_cfg.schema)},
        )
    assert dropped
    recorder.submit(second)
    async with asyncio.timeout(10):
        await recorder.flush()
    await recorder.close(1.0)
    [row] = (await _conversations(store, "acme")).values()
    assert (row.turns, row.tip) == (2, second.tip)
    assert "production turns not recorded yet; retried" not in log.events, log.events


async def test_a_conversation_opened_before_a_failed_batch_keeps_its_next_turn(
    store: Store,
) -> None:
    """A batch's statements commit one by one: a batch that failed after its new
    conversations were written is tried again, and meanwhile their next turns joined the
    queue. The run [opening, next] then found its conversation already there, and the next
    turn was dropped without a word (the review of session 24)."""
    agent = await _agent(store, "acme")
    opening, following = _turns("acme", agent, "hello", 2)
    await _write(store, "acme", [opening])  # written, then the batch failed after it
    await _write(store, "acme", [opening, following])  # tried again with the turn after
    [row] = (await _conversations(store, "acme")).values()
    assert (row.turns, row.tip) == (2, following.tip)
    assert (await _trajectory(store, "acme", row)).messages == following.messages
