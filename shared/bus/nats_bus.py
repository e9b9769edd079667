"""NatsBus: one JetStream connection per process; publishes contracts, owns streams, consumers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from shared import subjects
from shared.config import ConsumerConfig as ConsumerSettings
from shared.config import NatsConfig
from shared.errors import RetraceError, RetryableError
from shared.logging import get_logger
from shared.messages import Contract, encode
from shared.retry import RetryPolicy, with_retry

from .streams import contract_subject, stream_configs, stream_for

log = get_logger(__name__)

MSG_ID = "Nats-Msg-Id"
CONTRACT_HEADER = "Retrace-Contract"

PUBLISH_RETRY = RetryPolicy(
    "nats-publish",
    attempts=4,
    base_delay=0.25,
    max_delay=3.0,
    timeout=10.0,
    retry_on=(
        asyncio.TimeoutError,
        nats.errors.TimeoutError,
        nats.errors.NoRespondersError,
        nats.errors.ConnectionReconnectingError,
        nats.errors.OutboundBufferLimitError,
    ),
)
"""A publish waits out a short NATS restart, then fails the handler (which is then retried)."""
BUS_GONE = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError)
"""A connection that gave up reconnecting (its service is then stopping) or is closing: not
retried, but as retryable for the caller as a timeout (an HTTP request gets its 503)."""
PUBLISH_FAILED: tuple[type[BaseException], ...] = (*PUBLISH_RETRY.retry_on, *BUS_GONE)


class NatsBus:
    def __init__(self, nc: Client, cfg: NatsConfig) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=cfg.request_timeout)
        self.cfg = cfg

    @classmethod
    async def connect(
        cls,
        url: str,
        cfg: NatsConfig,
        *,
        name: str = "retrace",
        on_closed: Callable[[], Awaitable[None]] | None = None,
    ) -> NatsBus:
        holder: list[Client] = []

        async def _disconnected() -> None:
            if holder and (holder[0].is_draining or holder[0].is_closed):
                return  # our own shutdown
            log.warning("nats disconnected", url=url)

        async def _reconnected() -> None:
            log.info("nats reconnected", url=url)

        async def _error(exc: Exception) -> None:
            log.warning("nats error", error=repr(exc))

        async def _closed() -> None:
            if on_closed is not None:
                await on_closed()

        nc = await nats.connect(
            url,
            name=name,
            connect_timeout=cfg.connect_timeout,
            max_reconnect_attempts=cfg.reconnect_attempts,
            reconnect_time_wait=cfg.reconnect_wait,
            allow_reconnect=True,
            disconnected_cb=_disconnected,
            reconnected_cb=_reconnected,
            error_cb=_error,
            closed_cb=_closed,
        )
        holder.append(nc)
        return cls(nc, cfg)

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    def subject(self, tenant: str, contract: type[Contract] | Contract) -> str:
        return subjects.build(self.cfg.subject_prefix, tenant, contract.STAGE, contract.EVENT)

    async def ensure_streams(self) -> None:
        """Create or update every stream; safe to run from every process at every start."""
        for config in stream_configs(self.cfg):
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                await self.js.update_stream(config)

    async def ensure_consumer(
        self,
        durable: str,
        contract: type[Contract],
        settings: ConsumerSettings,
        tenant: str | None = None,
    ) -> str:
        """Create or update a durable pull consumer for one contract (every tenant's, or one
        tenant's); returns its stream."""
        stream = stream_for(self.cfg, contract)
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=(
                self.subject(tenant, contract)
                if tenant is not None
                else contract_subject(self.cfg, contract)
            ),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=settings.ack_wait,
            # The runtime dead-letters at max_deliver; the server's limit is a backstop for a
            # message whose handler keeps crashing the process before it can record anything.
            max_deliver=settings.max_deliver + 2,
            max_ack_pending=max(settings.concurrency * 4, 16),
        )
        try:
            # The server creates the consumer, or updates it in place when it exists.
            await self.js.add_consumer(stream, config)
        except BadRequestError as exc:
            # Never delete and recreate: a new consumer would replay the whole stream.
            raise RetraceError(
                f"consumer {durable} on {stream} exists with a config that cannot be changed in "
                f"place ({exc.description}); delete it with `nats consumer rm {stream} {durable}`"
            ) from exc
        return stream

    async def drop_consumer(self, stream: str, durable: str) -> bool:
        """Delete a consumer if it exists (safe on a work queue: unacknowledged messages stay
        in the stream for the next consumer); whether there was one."""
        try:
            await self.js.delete_consumer(stream, durable)
        except NotFoundError:
            return False
        return True

    async def waiting_tenants(self, contract: type[Contract]) -> list[str]:
        """Tenants with messages of `contract` in its stream (waiting or in flight), sorted."""
        info = await self.js.stream_info(
            stream_for(self.cfg, contract), subjects_filter=contract_subject(self.cfg, contract)
        )
        return sorted(
            subject.split(".")[-3]
            for subject, count in (info.state.subjects or {}).items()
            if count
        )

    async def publish(self, tenant: str, message: Contract, *, msg_id: str) -> None:
        """Publish a contract; `msg_id` makes a repeated publish a no-op inside the window.

        The id is the publisher's, unique within its tenant; on the wire it is qualified by
        the tenant (`<tenant>:<msg_id>`), since streams and their duplicate windows are
        shared by every tenant: two tenants' "job-1" are two messages."""
        await self.publish_raw(
            self.subject(tenant, message),
            encode(message),
            msg_id=f"{tenant}:{msg_id}",
            contract=f"{message.kind()}/{message.VERSION}",
        )

    async def publish_raw(
        self, subject: str, data: bytes, *, msg_id: str, contract: str = ""
    ) -> None:
        headers = {MSG_ID: msg_id}
        if contract:
            headers[CONTRACT_HEADER] = contract
        try:
            await with_retry(PUBLISH_RETRY, lambda: self.js.publish(subject, data, headers=headers))
        except PUBLISH_FAILED as exc:
            raise RetryableError(f"publish to {subject} failed: {exc!r}") from exc

    async def consumer_pending(self, stream: str, durable: str) -> tuple[int, int] | None:
        """(messages waiting, messages in flight) for a consumer, or None if it does not exist."""
        try:
            info = await self.js.consumer_info(stream, durable)
        except NotFoundError:
            return None
        return info.num_pending or 0, info.num_ack_pending or 0

    async def close(self) -> None:
        """Flush and close. Not drain: pull subscriptions have nothing to hand over (unacked
        messages return to the stream), and draining them waits on queues nobody reads."""
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.flush(), timeout=5)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("nats flush failed; closing anyway", error=repr(exc))
        await self.nc.close()
