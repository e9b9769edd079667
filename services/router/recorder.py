"""Production turns written to Postgres after their replies are sent, in batches.

A reply goes back to the caller as soon as the endpoint gives it; the turn it ends (the
conversation's row, its trajectory with the whole history) joins a queue that one task
writes: each tenant's waiting turns (up to `batch` in all) in two statements over arrays on
one connection the task holds, in order within a conversation, so the store keeps up with
thousands of turns a second. A store that cannot take a batch is retried with backoff,
oldest first, until it takes it (at most `limit` turns wait: past that the router refuses
new requests with a 503 until the store catches up, rather than answer a turn it could not
keep); while it refuses them they are also journaled on local disk, and what it has not
taken when the router stops goes to the spool (`spool.Spool`); the next router to start
writes both first; `flush` waits until what was answered so far is written (feedback on a
conversation, a graceful shutdown, tests). The conversation a turn belongs to, branches
included, was decided before its reply was sent (see `conversations.Recent`); the write
checks it once more against the store (a conversation moves on only from the tip its turn
found), for a turn another router process answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import (
    ArgumentError,
    CompileError,
    DataError,
    DBAPIError,
    IntegrityError,
    InvalidRequestError,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from services.router.conversations import Known, tip
from shared.logging import get_logger
from shared.store import Store
from shared.store.engine import STORE_ERRORS
from shared.store.models import Adapter, Agent, Conversation, Trajectory, storable_json

if TYPE_CHECKING:
    from services.router.spool import Held, Journal, Spool

log = get_logger(__name__)

REFUSED = (
    IntegrityError,
    DataError,
    CompileError,
    ArgumentError,
    InvalidRequestError,
)
"""What retrying cannot mend: rows a working store refuses (a key or agent deleted
meanwhile), and a statement of ours that is wrong. A batch refused so is written again turn by
turn (`keep`, the ORM's statements), and a turn refused alone is logged as lost. The rest of
`STORE_ERRORS` is waited for: a store out of reach, or one missing a table (a migration not
run yet), loses nothing by waiting."""


@dataclass(frozen=True)
class Opening:
    """A conversation a turn opens (a new one, or a branch): its row is written with the
    turn."""

    agent_id: uuid.UUID
    adapter_id: uuid.UUID | None
    api_key_id: uuid.UUID | None
    route: dict[str, Any]
    turns: int = 0
    """Turns of the history before it (a branch continues one)."""
    trajectory_id: uuid.UUID = field(default_factory=uuid.uuid4)
    """Its trajectory's id, fixed before the write, so a retried write is recognised."""


@dataclass
class Turn:
    """One request's place in its conversation."""

    tenant: str
    known: Known
    found_tip: str
    """The conversation's tip when this request found it ("" for a new one)."""
    found_turns: int
    opening: Opening | None = None
    """Set when this turn opens the conversation (its row does not exist yet)."""

    @property
    def conversation_id(self) -> uuid.UUID:
        return self.known.id


@dataclass(frozen=True)
class Answered:
    """A turn whose reply was sent: what its record needs."""

    turn: Turn
    model: str
    messages: list[dict[str, Any]]
    """The whole history, the reply last."""
    tip: str
    """The hash of `messages` (`conversations.tip`)."""
    tokens: int
    latency_ms: float


class Recorder:
    def __init__(
        self,
        store: Store,
        *,
        limit: int,
        batch: int = 512,
        spool: Spool | None = None,
    ) -> None:
        self.store = store
        self.limit = limit
        self.batch = batch
        self.spool = spool
        """Where turns still unwritten at `close` go, and where `start` takes them back."""
        self._claims: list[tuple[int, Held]] = []
        """Spool files taken at start, each with the number of its last turn."""
        self._replayed = 0
        """Turns taken back from the spool at start and not written yet (`limit` counts only
        new ones)."""
        self._replay_last = 0
        """The number of the last turn taken back from the spool."""
        self._journal: Journal | None = None
        """This process's journal of turns the store refused, while there is one."""
        self._journaled = 0
        """The number of the last turn in the journal."""
        self._failing = False
        """Whether the last write failed (the store is refusing turns)."""
        self._queue: collections.deque[tuple[int, Answered]] = collections.deque()
        """Turns waiting, with their submission number, oldest first."""
        self._submitted = 0
        self._reserved = 0
        """Requests in progress that hold a place in the queue for their turn (`reserve`)."""
        self._progress = asyncio.Condition()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: AsyncConnection | None = None
        """The connection batches are written on, held from one to the next: a checkout from
        the pool and its ping were most of a small batch's cost. Dropped on any failure, so
        a store that restarted is reached on a new one."""

    def start(self) -> None:
        """Start writing; first the turns a stopped router left in the spool."""
        for held, turns in self.spool.claim() if self.spool is not None else []:
            for answered in turns:
                self._enqueue(answered)
            self._replayed += len(turns)
            self._claims.append((self._submitted, held))
            log.info("spooled turns taken back", turns=len(turns), file=str(held.path))
        self._replay_last = self._submitted
        self._task = asyncio.create_task(self._run(), name="router-recorder")

    @property
    def waiting(self) -> int:
        """Turns answered and not written yet."""
        return len(self._queue)

    def reserve(self) -> bool:
        """Hold a place in the queue for the turn of a request about to be answered; False
        when `limit` turns wait or are held (the request is then refused, before a reply
        is made that could not be recorded). Give it back with `release` when the request
        ends, whether or not it submitted a turn."""
        if len(self._queue) + self._reserved >= self.limit + self._replayed:
            return False
        self._reserved += 1
        return True

    def release(self) -> None:
        self._reserved -= 1

    def submit(self, answered: Answered) -> None:
        """Queue a turn to be written (never blocks). A turn submitted without a place
        `reserve`d for it is lost if `limit` turns wait already."""
        if len(self._queue) >= self.limit + self._replayed + self._reserved:
            log.error(
                "production trajectory lost: too many turns wait for the store",
                conversation=str(answered.turn.conversation_id),
                waiting=len(self._queue),
            )
            return
        self._enqueue(answered)

    def _enqueue(self, answered: Answered) -> None:
        self._submitted += 1
        self._queue.append((self._submitted, answered))
        self._wake.set()

    def _release(self) -> None:
        """Delete the spool files whose turns are all written."""
        while self._claims and self._settled(self._claims[0][0]):
            _, held = self._claims.pop(0)
            held.delete()

    async def _keep_on_disk(self) -> None:
        """Put the turns waiting that are not in the journal yet into it (the store refused
        a batch: they may wait long, and a router that dies meanwhile must not lose them)."""
        if self.spool is None or not self._queue or self._queue[-1][0] <= self._journaled:
            return
        fresh = [a for n, a in self._queue if n > self._journaled]
        last = self._queue[-1][0]  # before the awaits: turns answered meanwhile are not in it
        try:
            if self._journal is None:
                self._journal = await asyncio.to_thread(self.spool.journal)
            await asyncio.to_thread(self._journal.append, fresh)
        except OSError as exc:
            log.error(
                "turns waiting for the store not journaled", count=len(fresh), error=repr(exc)
            )
            return
        self._journaled = last

    def _forget_journal(self) -> None:
        """Delete the journal once every turn in it is written."""
        if self._journal is not None and self._settled(self._journaled):
            self._journal.delete()
            self._journal = None

    def _settled(self, through: int) -> bool:
        return not self._queue or self._queue[0][0] > through

    async def flush(self) -> None:
        """Wait until every turn submitted so far is written (or given up on as lost); bound
        the wait with `asyncio.timeout`."""
        target = self._submitted
        async with self._progress:
            await self._progress.wait_for(lambda: self._settled(target))

    async def close(self, grace: float) -> None:
        """Write what waits (for up to `grace` s, none while the store refuses it), then
        stop; what is left goes to the spool (logged as lost where there is none)."""
        if self._task is None:
            return
        if self._queue and not self._failing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.flush()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            with contextlib.suppress(*STORE_ERRORS):
                await self._conn.close()
            self._conn = None
        self._release()
        self._forget_journal()
        if self._queue and self.spool is not None:
            try:
                path = await asyncio.to_thread(self.spool.put, [a for _, a in self._queue])
            except OSError as exc:
                log.error(
                    "production trajectories lost at shutdown: the spool refused them",
                    count=len(self._queue),
                    error=repr(exc),
                )
            else:
                log.warning(
                    "production turns spooled: the store did not take them before shutdown",
                    count=len(self._queue),
                    file=str(path),
                )
                self._queue.clear()
        # what the files held is written or in the new spool file; else they stay on disk
        # for the next router
        files: list[Held] = [held for _, held in self._claims]
        if self._journal is not None:
            files.append(self._journal)
        for held in files:
            if self._queue:
                held.release()
            else:
                held.delete()
        self._claims.clear()
        self._journal = None
        if self._queue:
            log.error("production trajectories lost at shutdown", count=len(self._queue))

    async def _run(self) -> None:
        delay = 0.5
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                # the batch stays at the front of the queue while it is written, so `flush`,
                # `close` and `limit` count it; only what was written leaves it
                taken = list(itertools.islice(self._queue, self.batch))
                by_tenant: dict[str, list[tuple[int, Answered]]] = {}
                for n, answered in taken:
                    by_tenant.setdefault(answered.turn.tenant, []).append((n, answered))
                done: set[int] = set()
                failure: BaseException | None = None
                for tenant, turns in by_tenant.items():
                    try:
                        await self._write(tenant, turns, done)
                    except STORE_ERRORS as exc:
                        failure = exc
                # the unwritten stay first, in their order: a tenant's turns stay in order
                for _ in taken:
                    self._queue.popleft()
                left = [(n, a) for n, a in taken if n not in done]
                self._replayed -= sum(n <= self._replay_last for n in done)
                self._queue.extendleft(reversed(left))
                async with self._progress:
                    self._progress.notify_all()
                self._release()
                self._forget_journal()
                self._failing = failure is not None
                if failure is not None:
                    await self._keep_on_disk()
                    log.warning(
                        "production turns not recorded yet; retried",
                        turns=len(left),
                        error=repr(failure),
                        retry_in_s=delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                delay = 0.5

    async def _batched(self, tenant: str, turns: list[Answered]) -> list[Answered]:
        """`write_batch` on the held connection, made first where there is none; tried once
        more on a new one when the held one turns out dead (Postgres restarted since the
        last batch). Safe to repeat (see `write_batch`)."""
        for attempt in (1, 2):
            conn, fresh = self._conn, self._conn is None
            if conn is None:
                conn = self._conn = await self.store.engine.connect()
            try:
                if fresh:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                return await write_batch(conn, tenant, turns)
            except BaseException as exc:
                self._conn = None
                with contextlib.suppress(*STORE_ERRORS):
                    await conn.invalidate()
                if attempt == 1 and isinstance(exc, DBAPIError) and exc.connection_invalidated:
                    continue
                raise
        raise AssertionError("unreachable")

    async def _write(self, tenant: str, turns: list[tuple[int, Answered]], done: set[int]) -> None:
        """A tenant's turns: batched statements for what is common (new conversations,
        continued ones), then `keep` for the rest in a transaction. A turn the store refuses
        for its data (a row it points to deleted meanwhile) is then written alone, so it
        cannot hold the others back; one that still fails is logged as lost. The numbers of
        the turns settled go to `done` as they are."""
        try:
            apart = await self._batched(tenant, [a for _, a in turns])
            if apart:
                async with self.store.tenant(tenant) as session:
                    for answered in apart:
                        await keep(session, answered)
            done.update(n for n, _ in turns)
            return
        except REFUSED as exc:
            log.warning("a batch of turns was refused; written one by one", error=repr(exc))
        except STORE_ERRORS:
            raise
        except Exception:  # our own bug in the batched statements: the ORM's may still do
            log.exception("a batch of turns failed; written one by one")
        for n, answered in turns:
            try:
                async with self.store.tenant(tenant) as session:
                    await keep(session, answered)
            except REFUSED:
                log.exception(
                    "production turn lost: the store refused it",
                    conversation=str(answered.turn.conversation_id),
                )
            except STORE_ERRORS:
                raise
            except Exception:  # our own bug: this turn can never be written, so say so
                log.exception(
                    "production turn lost: its record failed",
                    conversation=str(answered.turn.conversation_id),
                )
            done.add(n)


@dataclass
class _Run:
    """A conversation's consecutive turns within one batch, written as one: the first
    turn's opening and found tip, the last one's history and tip, tokens and time summed."""

    turns: list[Answered]

    @property
    def first(self) -> Answered:
        return self.turns[0]

    @property
    def last(self) -> Answered:
        return self.turns[-1]

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.turns)

    @property
    def latency_ms(self) -> float:
        return sum(a.latency_ms for a in self.turns)


def _runs(turns: list[Answered]) -> tuple[list[_Run], list[Answered]]:
    """The batch's turns as runs of one conversation each, and the turns that do not chain
    onto their conversation's run (written one by one afterwards, by `keep`)."""
    runs: dict[uuid.UUID, _Run] = {}
    apart: list[Answered] = []
    odd: set[uuid.UUID] = set()
    for answered in turns:
        cid = answered.turn.conversation_id
        run = runs.get(cid)
        if cid in odd:
            apart.append(answered)
        elif run is None:
            runs[cid] = _Run([answered])
        elif answered.turn.opening is None and answered.turn.found_tip == run.last.tip:
            run.turns.append(answered)
        else:
            odd.add(cid)
            apart.append(answered)
    return list(runs.values()), apart


async def write_batch(conn: AsyncConnection, tenant: str, turns: list[Answered]) -> list[Answered]:
    """Write a tenant's turns with two statements whatever their number, on `conn` outside
    any transaction (each statement is whole or nothing): new conversations with their
    trajectories, then continued ones moved on (each only from the tip its turn found). The
    turns these do not take are returned, in order, for `keep`: a conversation another router
    process moved on (a branch), and one that was already there when its opening turn came
    (a batch tried again after its statements went in, or some of them: its later turns
    must still be kept, and `keep` knows a turn written before)."""
    runs, apart = _runs(turns)
    opened = [r for r in runs if r.first.turn.opening is not None]
    continued = [r for r in runs if r.first.turn.opening is None]
    left: list[Answered] = []
    if opened:
        written = await _open(conn, tenant, opened)
        left += [a for r in opened if r.first.turn.conversation_id not in written for a in r.turns]
    if continued:
        left += await _continue(conn, tenant, continued)
    return [*left, *apart]


async def _open(conn: AsyncConnection, tenant: str, runs: list[_Run]) -> set[uuid.UUID]:
    """New conversations and their trajectories, in one statement over arrays: those of an
    agent deleted since are left out, an adapter deleted since is none. The ids of the
    conversations written."""
    rows = [(r, o) for r in runs if (o := r.first.turn.opening) is not None]
    result = await conn.exec_driver_sql(
        OPEN,
        (
            tenant,
            [r.first.turn.conversation_id for r, _ in rows],
            [o.trajectory_id for _, o in rows],
            [o.agent_id for _, o in rows],
            [o.adapter_id for _, o in rows],
            [o.api_key_id for _, o in rows],
            [r.last.model for r, _ in rows],
            [storable_json(r.last.messages) for r, _ in rows],
            [r.tokens for r, _ in rows],
            [r.latency_ms for r, _ in rows],
            [r.last.tip for r, _ in rows],
            [storable_json(o.route) for _, o in rows],
            [o.turns + len(r.turns) for r, o in rows],
        ),
    )
    return {cid for (cid,) in result}


# The batched statements are the driver's SQL, not SQLAlchemy's: compiling and scoping ORM
# statements cost the router's event loop 4 to 5 ms a batch whatever its size. The session's
# tenant scope does not see them, so each names its tenant ($1) wherever it reads or writes:
# only the tenant's own agents, adapters, conversations and trajectories are touched.
OPEN = """
WITH living AS (
    SELECT o.*, adapters.id AS served_by
    FROM unnest($2::uuid[], $3::uuid[], $4::uuid[], $5::uuid[], $6::uuid[], $7::text[],
                $8::text[], $9::integer[], $10::float8[], $11::text[], $12::text[],
                $13::integer[])
         AS o(id, trajectory_id, agent_id, adapter_id, api_key_id, model, messages, tokens,
              latency_ms, tip, route, turns)
    JOIN agents ON agents.id = o.agent_id AND agents.tenant_id = $1
    LEFT JOIN adapters ON adapters.id = o.adapter_id AND adapters.tenant_id = $1
), trajectories_written AS (
    INSERT INTO trajectories (id, tenant_id, agent_id, request_id, adapter_id, source, model,
                              messages, tokens, latency_ms, trial, reward_breakdown)
    SELECT trajectory_id, $1, agent_id, id, served_by, 'production', model, messages::jsonb,
           tokens, latency_ms, 0, '{}'::jsonb
    FROM living
    ON CONFLICT DO NOTHING
)
INSERT INTO conversations (id, tenant_id, agent_id, adapter_id, api_key_id, trajectory_id,
                           tip, route, turns, branch_of)
SELECT id, $1, agent_id, served_by, api_key_id, trajectory_id, tip, route::jsonb, turns,
       (route::jsonb->>'branch_of')::uuid
FROM living
ON CONFLICT DO NOTHING
RETURNING id
"""
"""New conversations (those of an agent deleted since left out) with their trajectories; the
ids of those written (one already there is not written again)."""
MOVE = """
WITH moved AS (
    UPDATE conversations
    SET tip = m.tip, turns = conversations.turns + m.n, updated_at = now()
    FROM unnest($2::uuid[], $3::text[], $4::text[], $5::integer[]) AS m(id, found, tip, n)
    WHERE conversations.tenant_id = $1 AND conversations.id = m.id
      AND conversations.tip = m.found AND conversations.trajectory_id IS NOT NULL
    RETURNING conversations.id, conversations.trajectory_id
), extended AS (
    UPDATE trajectories
    SET messages = h.messages::jsonb, tokens = trajectories.tokens + h.tokens,
        latency_ms = trajectories.latency_ms + h.latency_ms
    FROM moved
    JOIN unnest($2::uuid[], $6::text[], $7::integer[], $8::float8[])
         AS h(id, messages, tokens, latency_ms) ON h.id = moved.id
    WHERE trajectories.tenant_id = $1 AND trajectories.id = moved.trajectory_id
)
SELECT id FROM moved
"""
"""Conversations moved on, each only from the tip its turn found, and their trajectories
given the whole history; the ids of those moved."""


async def _continue(conn: AsyncConnection, tenant: str, runs: list[_Run]) -> list[Answered]:
    """Continued conversations moved on, each from the tip its first turn found; the turns
    of those that were not there (or have no trajectory), for `keep`."""
    result = await conn.exec_driver_sql(
        MOVE,
        (
            tenant,
            [r.first.turn.conversation_id for r in runs],
            [r.first.turn.found_tip for r in runs],
            [r.last.tip for r in runs],
            [len(r.turns) for r in runs],
            [storable_json(r.last.messages) for r in runs],
            [r.tokens for r in runs],
            [r.latency_ms for r in runs],
        ),
    )
    moved = {cid for (cid,) in result}
    return [a for r in runs if r.first.turn.conversation_id not in moved for a in r.turns]


async def keep(session: Any, answered: Answered) -> None:
    """The conversation's trajectory takes the turn. When the store shows another turn of the
    same conversation recorded since this one found it (another router process answered it),
    this turn becomes a branch of its own, a new conversation with the same route, so neither
    turn overwrites the other."""
    if answered.turn.opening is None and await _moved_on(session, answered):
        return
    turn = answered.turn
    conversation = await session.get(Conversation, turn.conversation_id, with_for_update=True)
    if conversation is None:
        o = turn.opening
        if o is None or await session.get(Agent, o.agent_id) is None:
            return  # deleted since (its agent was)
        adapter_id = o.adapter_id
        if adapter_id is not None and await session.get(Adapter, adapter_id) is None:
            adapter_id = None  # deleted since it served this turn
        conversation = Conversation(
            id=turn.conversation_id,
            agent_id=o.agent_id,
            adapter_id=adapter_id,
            api_key_id=o.api_key_id,
            branch_of=_branch_of(o.route),
            tip="",
            route=o.route,
            turns=o.turns,
        )
        session.add(conversation)
        await session.flush()
    if conversation.tip == answered.tip:
        return  # written before: a retry of a write whose commit was not heard of
    if conversation.tip != turn.found_tip:
        kept = await _branched(session, conversation, answered)
        if kept is None:
            return  # written before (a spool or journal replayed)
        conversation = kept
    trajectory = (
        await session.get(Trajectory, conversation.trajectory_id)
        if conversation.trajectory_id
        else None
    )
    if trajectory is None:
        trajectory = Trajectory(
            id=turn.opening.trajectory_id if turn.opening is not None else uuid.uuid4(),
            agent_id=conversation.agent_id,
            request_id=conversation.id,
            adapter_id=conversation.adapter_id,
            source="production",
            model=answered.model,
            messages=answered.messages,
            tokens=answered.tokens,
            latency_ms=answered.latency_ms,
        )
        session.add(trajectory)
        await session.flush()
        conversation.trajectory_id = trajectory.id
    else:
        trajectory.messages = answered.messages
        trajectory.tokens += answered.tokens
        trajectory.latency_ms += answered.latency_ms
    conversation.tip = answered.tip
    conversation.turns += 1


async def _branched(
    session: Any, conversation: Conversation, answered: Answered
) -> Conversation | None:
    """Where a turn goes whose conversation has moved on from the tip it found (another
    router process answered a turn of it meanwhile): None where the conversation or one of
    its branches holds the turn already (it was written before); else the branch at the tip
    the turn found, so the later turns of a branch found only here go on in it (each made a
    branch of its own, its history again); else a new branch."""
    branches = list(
        await session.scalars(
            select(Conversation)
            .where(Conversation.branch_of == conversation.id)
            .order_by(Conversation.created_at)
            .with_for_update()
        )
    )
    for candidate in (conversation, *branches):
        if candidate.tip == answered.tip or await _holds(session, candidate, answered):
            return None
    at_tip = next((b for b in branches if b.tip == answered.turn.found_tip), None)
    if at_tip is not None:
        return at_tip
    branch = Conversation(
        agent_id=conversation.agent_id,
        adapter_id=conversation.adapter_id,
        api_key_id=conversation.api_key_id,
        branch_of=conversation.id,
        tip="",
        route={**conversation.route, "branch_of": str(conversation.id)},
        turns=answered.turn.found_turns,
    )
    session.add(branch)
    await session.flush()
    return branch


def _branch_of(route: dict[str, Any]) -> uuid.UUID | None:
    """The conversation a new one branches from, as its route names it."""
    return uuid.UUID(route["branch_of"]) if "branch_of" in route else None


async def _holds(session: Any, conversation: Conversation, answered: Answered) -> bool:
    """Whether the conversation's trajectory already holds this turn's whole history (the
    turn was written, and later turns of it since)."""
    if conversation.trajectory_id is None:
        return False
    stored = await session.get(Trajectory, conversation.trajectory_id)
    n = len(answered.messages)
    return (
        stored is not None
        and len(stored.messages) >= n
        and tip(stored.messages[:n]) == answered.tip
    )


async def _moved_on(session: Any, answered: Answered) -> bool:
    """The common case, a continued turn, in two statements and no object loads: the
    conversation moves from the tip this turn found to its own (its row locked by the
    update), and its trajectory takes the history. False, with nothing changed, when the
    conversation is not at that tip or has no trajectory: `keep` then decides."""
    turn = answered.turn
    moved = await session.execute(
        update(Conversation)
        .where(
            Conversation.id == turn.conversation_id,
            Conversation.tip == turn.found_tip,
            Conversation.trajectory_id.is_not(None),
        )
        .values(tip=answered.tip, turns=Conversation.turns + 1)
        .returning(Conversation.trajectory_id)
        .execution_options(synchronize_session=False)
    )
    trajectory_id = moved.scalar_one_or_none()
    if trajectory_id is None:
        return False
    await session.execute(
        update(Trajectory)
        .where(Trajectory.id == trajectory_id)
        .values(
            messages=answered.messages,
            tokens=Trajectory.tokens + answered.tokens,
            latency_ms=Trajectory.latency_ms + answered.latency_ms,
        )
        .execution_options(synchronize_session=False)
    )
    return True
