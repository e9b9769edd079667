"""Handling one delivered message: decode, run the handler once in effect, ack or retry or
dead-letter.

Exactly-once effects on at-least-once delivery: the handler's database writes, the record that
the message was processed and the messages it emits (its outbox) commit in one transaction.
A redelivery of a processed message skips the handler and re-publishes the outbox; outbox
message ids are derived from the incoming id, so JetStream and downstream consumers drop the
repeats.

Long handlers (`long_running`: rollouts, training, judge calls) get no transaction of their
own: holding one across minutes of model work would pin a pooled connection, keep row locks
and stop vacuum. They read and write in short transactions of their own (`ctx.store`), each
idempotent, and write their result in `ctx.record()`: the one transaction that also records
the message as processed with its outbox. A handler that never opens it is recorded when it
returns.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from nats.aio.msg import Msg
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from shared import subjects
from shared.bus.nats_bus import CONTRACT_HEADER, MSG_ID, NatsBus
from shared.config import ConsumerConfig
from shared.errors import Cancelled, ContractError, PermanentError, RetryableError
from shared.logging import get_logger
from shared.messages import Contract, DeadLetter, decode
from shared.runtime.metrics import ServiceMetrics
from shared.store import Store
from shared.store.models import ProcessedMessage

log = get_logger(__name__)
MAX_ID = 150
"""Longest incoming message id stored as is (the column holds 200)."""


class HandlerTimeoutError(RetryableError):
    """A handler ran past its contract's time limit: it was cancelled, the message goes back."""


class AlreadyRecordedError(Exception):
    """Another delivery of the same message recorded it first (its outbox is the one sent)."""


@dataclass
class HandlerContext:
    """What a handler gets beside its message: its tenant's transaction (a long handler: the
    means to record its result) and a way to emit."""

    tenant: str
    _session: AsyncSession | None
    subject: str
    msg_id: str
    attempt: int
    """1 on first delivery."""
    heartbeat: Callable[[], Awaitable[None]]
    """Tell JetStream the message is still being worked on (also sent automatically); a
    heartbeat that cannot be sent is logged, never raised."""
    store: Store
    """For work that must commit on its own, before the handler ends (long handlers'
    progress); such writes must be idempotent themselves."""
    outbox: list[dict[str, Any]] = field(default_factory=list)
    _recorder: Callable[[], AbstractAsyncContextManager[AsyncSession]] | None = None
    recorded: bool = False
    """A long handler's result and its outbox are committed."""

    @property
    def session(self) -> AsyncSession:
        """The handler's transaction (short handlers only)."""
        if self._session is None:
            raise RuntimeError(
                "a long-running handler has no transaction: use ctx.store for short ones "
                "and ctx.record() for its result"
            )
        return self._session

    def record(self) -> AbstractAsyncContextManager[AsyncSession]:
        """Long handlers only: a transaction for the handler's result that also records the
        message as processed, with everything emitted so far; at most once per delivery.
        Raises `AlreadyRecordedError` (before the block runs) when another delivery of the
        message recorded it first."""
        if self._recorder is None:
            raise RuntimeError("only a long-running handler records its own result")
        if self.recorded:
            raise RuntimeError("this delivery is recorded already")
        return self._recorder()

    def emit(self, message: Contract, *, key: str | None = None) -> None:
        """Publish `message` for the same tenant once this handler's transaction commits.

        `key` names the emission when a handler emits several messages of one kind."""
        if self.recorded:
            raise RuntimeError("emitted after the delivery was recorded: it would be lost")
        suffix = key if key is not None else str(len(self.outbox))
        self.outbox.append(
            {
                "kind": message.kind(),
                "version": message.VERSION,
                "stage": message.STAGE,
                "event": message.EVENT,
                "payload": msgspec.to_builtins(message),
                "msg_id": child_id(self.msg_id, message.kind(), suffix),
            }
        )


def child_id(parent: str, kind: str, suffix: str) -> str:
    """The id of a message emitted while handling `parent`: deterministic (a re-publish is a
    duplicate) and of fixed length, however long the chain of messages that led to it."""
    digest = hashlib.sha256(f"{parent}/{kind}/{suffix}".encode()).hexdigest()[:32]
    return f"{kind}/{digest}"


def record_id(msg_id: str) -> str:
    """The `processed_messages` key for an incoming id (ids from outside may be any length)."""
    if len(msg_id) <= MAX_ID:
        return msg_id
    return "sha256/" + hashlib.sha256(msg_id.encode()).hexdigest()


Handler = Callable[[Any, HandlerContext], Awaitable[None]]
H = TypeVar("H", bound=Callable[..., Awaitable[None]])


def long_running(handler: H) -> H:
    """Mark a handler as long work: it runs outside any transaction (see the module's doc)."""
    handler.long_running = True  # type: ignore[attr-defined]
    return handler


def is_long_running(handler: Handler) -> bool:
    return bool(getattr(handler, "long_running", False))


@dataclass
class Delivery:
    """Everything needed to process messages of one contract for one durable consumer."""

    consumer: str
    contract: type[Contract]
    handler: Handler
    bus: NatsBus
    store: Store
    settings: ConsumerConfig
    metrics: ServiceMetrics
    _handling: dict[str, asyncio.Future[str]] = field(default_factory=dict, init=False, repr=False)
    """Messages this process is handling now, by id: each one's outcome once it ends."""

    async def process(self, msg: Msg) -> None:
        started = time.perf_counter()
        meta = msg.metadata
        attempt = meta.num_delivered
        msg_id = record_id(
            (msg.headers or {}).get(MSG_ID) or f"{meta.stream}:{meta.sequence.stream}"
        )
        bound = log.bind(
            consumer=self.consumer, subject=msg.subject, msg_id=msg_id, attempt=attempt
        )
        outcome = "ok"
        try:
            try:
                tenant = subjects.parse(msg.subject, self.bus.cfg.subject_prefix).tenant
                message = decode(msg.data, self.contract)
            except ContractError as exc:
                outcome = "dead_lettered"
                bound.error("malformed message dead-lettered", error=str(exc))
                await self._dead_letter(msg, msg_id, str(exc), "contract")
                return
            running = self._handling.get(msg_id)
            if running is not None:
                outcome = await self._follow(msg, running, bound)
                return
            if attempt > self.settings.max_deliver:
                # Earlier deliveries never finished (the process died or hung, or the outbox
                # could not be published). Committed work still gets its messages out.
                outbox = await self._processed_outbox(tenant, msg_id)
                if outbox is not None:
                    await self._publish_outbox(tenant, outbox)
                    await msg.ack()
                    outcome = "duplicate"
                    return
                outcome = "dead_lettered"
                error = f"delivered {attempt} times without completing"
                bound.error("message exhausted its deliveries", error=error)
                await self._dead_letter(msg, msg_id, error, "exhausted")
                return
            ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._handling[msg_id] = ended
            try:
                outcome = await self._handle(msg, tenant, message, msg_id, attempt, bound)
            except asyncio.CancelledError:
                outcome = "requeued"
                raise
            finally:
                del self._handling[msg_id]
                ended.set_result(outcome)
        except asyncio.CancelledError:
            # Shutdown: hand the message back at once rather than waiting for ack_wait.
            outcome = "requeued"
            await _quietly(msg.nak())
            raise
        finally:
            self.metrics.handled.labels(self.contract.kind(), outcome).inc()
            self.metrics.latency.labels(self.contract.kind()).observe(time.perf_counter() - started)

    async def _follow(self, msg: Msg, running: asyncio.Future[str], bound: Any) -> str:
        """A redelivery of a message this process is still handling (its heartbeats were late:
        an event loop kept busy past `ack_wait`) is never run a second time beside the first.
        It is kept alive until the running delivery ends, then acked if that one settled the
        message; a running delivery that handed the message back (nak) has asked for the next
        delivery already."""
        bound.warning("redelivered while still being handled here; following that delivery")
        heartbeat = asyncio.create_task(self._heartbeat(msg))
        try:
            outcome = await asyncio.shield(running)
        finally:
            heartbeat.cancel()
        if outcome not in ("retried", "requeued"):
            await _quietly(msg.ack())
        return "followed"

    async def _handle(
        self, msg: Msg, tenant: str, message: Contract, msg_id: str, attempt: int, bound: Any
    ) -> str:
        heartbeat = asyncio.create_task(self._heartbeat(msg))
        committed = False
        limit = self.settings.time_limit(self.contract.kind(), self.contract.TIME_LIMIT_S)
        try:
            clock = asyncio.timeout(limit)
            try:
                async with clock:
                    outbox, duplicate = await self._run_once(msg, tenant, message, msg_id, attempt)
            except TimeoutError as exc:
                if not clock.expired():
                    raise  # the handler's own timeout, not its time limit
                raise HandlerTimeoutError(
                    f"{self.contract.kind()} handler ran past its time limit of {limit:g} s"
                ) from exc
            committed = True
            await self._publish_outbox(tenant, outbox)
            await msg.ack()
            if duplicate:
                bound.info("duplicate delivery skipped")
                return "duplicate"
            return "ok"
        except Cancelled as exc:
            bound.info("work cancelled; message dropped", reason=str(exc))
            await msg.ack()
            return "cancelled"
        except PermanentError as exc:
            kind = "contract" if isinstance(exc, ContractError) else "permanent"
            bound.error("permanent failure dead-lettered", error=str(exc), kind=kind)
            await self._dead_letter(msg, msg_id, str(exc), kind)
            return "dead_lettered"
        except Exception as exc:  # noqa: BLE001  boundary: any handler failure is retried, then dead-lettered
            if committed:
                # The effects are stored; only publishing failed. Never dead-letter that: a
                # redelivery re-publishes the stored outbox (see the top of `process`).
                bound.error("outbox publish failed after commit; will retry", error=repr(exc))
                await msg.nak(delay=self.settings.backoff[-1] if self.settings.backoff else 1.0)
                return "retried"
            if attempt >= self.settings.max_deliver:
                # A long handler can fail after its result was recorded (cleaning up, or its
                # time limit): the recorded outbox goes out rather than the message dying.
                recorded = await self._processed_outbox(tenant, msg_id)
                if recorded is not None:
                    bound.warning("failed after its result was recorded", error=repr(exc))
                    await self._publish_outbox(tenant, recorded)
                    await msg.ack()
                    return "ok"
                bound.error("handler failed on its last delivery; dead-lettered", error=repr(exc))
                await self._dead_letter(msg, msg_id, repr(exc), "exhausted")
                return "dead_lettered"
            delay = (
                self.settings.backoff[min(attempt, len(self.settings.backoff)) - 1]
                if self.settings.backoff
                else 0
            )
            bound.warning("handler failed; will retry", error=repr(exc), delay=delay)
            await msg.nak(delay=delay)
            return "retried"
        finally:
            heartbeat.cancel()

    async def _run_once(
        self, msg: Msg, tenant: str, message: Contract, msg_id: str, attempt: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """Run the handler unless this message was processed; return the outbox to publish."""
        if is_long_running(self.handler):
            return await self._run_long(msg, tenant, message, msg_id, attempt)
        async with self.store.tenant(tenant) as session:
            # The row lock taken by this insert serialises concurrent duplicate deliveries.
            claimed = await self._mark_processed(session, tenant, msg.subject, msg_id)
            if not claimed:
                done = await session.get(ProcessedMessage, (self.consumer, msg_id))
                return (list(done.outbox) if done else []), True
            ctx = self._context(msg, tenant, session, msg_id, attempt)
            await self.handler(message, ctx)
            await self._keep_outbox(session, msg_id, ctx.outbox)
            return ctx.outbox, False

    async def _run_long(
        self, msg: Msg, tenant: str, message: Contract, msg_id: str, attempt: int
    ) -> tuple[list[dict[str, Any]], bool]:
        """A long handler: no transaction while it works; its result, the processed record and
        the outbox commit together in `ctx.record()` (or when it returns)."""
        done = await self._processed_outbox(tenant, msg_id)
        if done is not None:
            return done, True
        ctx = self._context(msg, tenant, None, msg_id, attempt)

        @asynccontextmanager
        async def recorder() -> AsyncIterator[AsyncSession]:
            async with self.store.tenant(tenant) as session:
                claimed = await self._mark_processed(session, tenant, msg.subject, msg_id)
                if not claimed:
                    raise AlreadyRecordedError(msg_id)
                yield session
                await self._keep_outbox(session, msg_id, ctx.outbox)
            ctx.recorded = True

        ctx._recorder = recorder
        try:
            await self.handler(message, ctx)
            if not ctx.recorded:
                async with ctx.record():
                    pass
        except AlreadyRecordedError:
            return await self._processed_outbox(tenant, msg_id) or [], True
        return ctx.outbox, False

    def _context(
        self, msg: Msg, tenant: str, session: AsyncSession | None, msg_id: str, attempt: int
    ) -> HandlerContext:
        async def heartbeat() -> None:  # a lost connection is not the handler's failure
            await _quietly(msg.in_progress())

        return HandlerContext(tenant, session, msg.subject, msg_id, attempt, heartbeat, self.store)

    async def _mark_processed(
        self, session: AsyncSession, tenant: str, subject: str, msg_id: str
    ) -> bool:
        """Insert the message's `processed_messages` row; False if it was there already. A
        tenant that does not exist fails here (the row's foreign key) as a `ContractError`."""
        try:
            claimed = await session.execute(
                insert(ProcessedMessage)
                .values(
                    tenant_id=tenant,
                    subject=subject,
                    outbox=[],
                    consumer=self.consumer,
                    msg_id=msg_id,
                )
                .on_conflict_do_nothing()
                .returning(ProcessedMessage.msg_id)
            )
        except IntegrityError as exc:
            if "processed_messages_tenant_id" in str(exc.orig):
                raise ContractError(f"unknown tenant {tenant!r}") from exc
            raise
        return claimed.first() is not None

    async def _keep_outbox(
        self, session: AsyncSession, msg_id: str, outbox: list[dict[str, Any]]
    ) -> None:
        if outbox:
            await session.execute(
                update(ProcessedMessage)
                .where(
                    ProcessedMessage.consumer == self.consumer,
                    ProcessedMessage.msg_id == msg_id,
                )
                .values(outbox=outbox)
            )

    async def _processed_outbox(self, tenant: str, msg_id: str) -> list[dict[str, Any]] | None:
        async with self.store.tenant(tenant) as session:
            done = await session.get(ProcessedMessage, (self.consumer, msg_id))
            return list(done.outbox) if done is not None else None

    async def _publish_outbox(self, tenant: str, outbox: list[dict[str, Any]]) -> None:
        prefix = self.bus.cfg.subject_prefix
        for item in outbox:
            await self.bus.publish_raw(
                subjects.build(prefix, tenant, item["stage"], item["event"]),
                msgspec.json.encode(item["payload"]),
                msg_id=item["msg_id"],
                contract=f"{item['kind']}/{item['version']}",
            )

    async def _heartbeat(self, msg: Msg) -> None:
        interval = max(self.settings.ack_wait / 3, 0.5)
        while True:
            await asyncio.sleep(interval)
            await _quietly(msg.in_progress())

    async def _dead_letter(self, msg: Msg, msg_id: str, error: str, kind: str) -> None:
        meta = msg.metadata
        record = DeadLetter(
            subject=msg.subject,
            consumer=self.consumer,
            error=error[:8000],
            error_kind=kind,  # type: ignore[arg-type]
            deliveries=meta.num_delivered,
            msg_id=msg_id,
            stream_sequence=meta.sequence.stream,
            payload_b64=base64.b64encode(msg.data).decode(),
            payload_text=msg.data.decode("utf-8", errors="replace"),
        )
        await self.bus.publish_raw(
            subjects.dead_letter(self.bus.cfg.subject_prefix, msg.subject),
            msgspec.json.encode(record),
            msg_id=f"dlq/{self.consumer}/{msg_id}",
            contract=(msg.headers or {}).get(CONTRACT_HEADER, ""),
        )
        self.metrics.dead_lettered.labels(self.contract.kind(), kind).inc()
        await msg.term()


async def _quietly(call: Awaitable[None]) -> None:
    """Acks and heartbeats on a lost connection are not worth failing for: JetStream redelivers."""
    try:
        await call
    except Exception as exc:  # noqa: BLE001  boundary: a failed heartbeat/nak only delays redelivery
        log.debug("ack-side call failed", error=repr(exc))
