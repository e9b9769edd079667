"""Production turns written to Postgres after their replies are sent, in batches.

A reply goes back to the caller as soon as the endpoint gives it; the turn it ends (the
conversation's row, its trajectory with the whole history) joins a queue that one task
writes in order, a batch of consecutive same-tenant turns to a transaction. A store that
refuses a batch is retried with backoff, oldest first, until it takes it (at most `limit`
turns wait; past that a new one is logged as lost); `flush` waits until what was answered
so far is written (feedback on a conversation, a graceful shutdown, tests). The conversation
a turn belongs to, branches included, was decided before its reply was sent (see
`conversations.Recent`); the write checks it once more against the store, under the
conversation's row lock, for a turn another router process answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError

from services.router.conversations import Known
from shared.logging import get_logger
from shared.store import Store
from shared.store.models import Adapter, Agent, Conversation, Trajectory

log = get_logger(__name__)

STORE_ERRORS = (
    SQLAlchemyError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    ConnectionRefusedError,  # Postgres down; aiohttp's own connection errors are not this class
)
"""What a store that cannot serve a request raises (a client that hangs up is not one)."""


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
    def __init__(self, store: Store, *, limit: int, batch: int = 64) -> None:
        self.store = store
        self.limit = limit
        self.batch = batch
        self._queue: collections.deque[Answered] = collections.deque()
        self._submitted = 0
        self._settled = 0
        """Turns written, or given up on (lost), in submission order."""
        self._progress = asyncio.Condition()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="router-recorder")

    def submit(self, answered: Answered) -> None:
        """Queue a turn to be written (never blocks; over `limit` waiting, it is lost)."""
        if len(self._queue) >= self.limit:
            log.error(
                "production trajectory lost: too many turns wait for the store",
                conversation=str(answered.turn.conversation_id),
                waiting=len(self._queue),
            )
            return
        self._queue.append(answered)
        self._submitted += 1
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every turn submitted so far is written (or given up on as lost); bound
        the wait with `asyncio.timeout`."""
        target = self._submitted
        async with self._progress:
            await self._progress.wait_for(lambda: self._settled >= target)

    async def close(self, grace: float) -> None:
        """Write what waits (for up to `grace` s), then stop; what is left is logged as lost."""
        if self._task is None:
            return
        if self._queue:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.flush()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._queue:
            log.error("production trajectories lost at shutdown", count=len(self._queue))

    async def _run(self) -> None:
        delay = 0.5
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                tenant = self._queue[0].turn.tenant
                batch: list[Answered] = []
                for answered in self._queue:
                    if answered.turn.tenant != tenant or len(batch) == self.batch:
                        break
                    batch.append(answered)
                try:
                    async with self.store.tenant(tenant) as session:
                        for answered in batch:
                            await keep(session, answered)
                except STORE_ERRORS as exc:
                    log.warning(
                        "production turns not recorded yet; retried",
                        turns=len(batch),
                        error=repr(exc),
                        retry_in_s=delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                except Exception:  # our own bug: the batch can never be written, so say so
                    log.exception("production turns lost: their record failed", turns=len(batch))
                delay = 0.5
                for _ in batch:
                    self._queue.popleft()
                async with self._progress:
                    self._settled += len(batch)
                    self._progress.notify_all()


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
            tip="",
            route=o.route,
            turns=o.turns,
        )
        session.add(conversation)
        await session.flush()
    if conversation.tip != turn.found_tip:
        conversation = Conversation(
            agent_id=conversation.agent_id,
            adapter_id=conversation.adapter_id,
            api_key_id=conversation.api_key_id,
            tip="",
            route={**conversation.route, "branch_of": str(conversation.id)},
            turns=turn.found_turns,
        )
        session.add(conversation)
        await session.flush()
    trajectory = (
        await session.get(Trajectory, conversation.trajectory_id)
        if conversation.trajectory_id
        else None
    )
    if trajectory is None:
        trajectory = Trajectory(
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
