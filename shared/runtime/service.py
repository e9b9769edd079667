"""Service: the runner every retrace service uses.

Start: resolve URLs (embedded servers when unset), connect to Postgres and NATS with a named
retry policy, create streams and one durable pull consumer per handled contract, serve
`/healthz` and `/metrics`. Run: pull messages while fewer than `concurrency` are in flight.
Stop (SIGTERM/SIGINT): stop pulling, give in-flight handlers `shutdown_grace` seconds, nak what
is left so another instance takes it at once; stop listening for HTTP and give the requests in
flight the same grace; then the service's own stop hook, drain NATS, close Postgres.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping

import nats
from aiohttp import web
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from shared.bus import NatsBus
from shared.bus.delivery import Delivery, Handler
from shared.bus.streams import stream_for
from shared.config import ServiceConfig
from shared.embedded import resolve_urls
from shared.logging import get_logger
from shared.messages import Contract
from shared.retry import RetryPolicy, with_retry
from shared.runtime.http import MAX_BODY_BYTES, Health, build_app, listen, uptime_since
from shared.runtime.metrics import ServiceMetrics
from shared.store import Store
from shared.store.migrate import upgrade_async

log = get_logger(__name__)

STARTUP_RETRY = RetryPolicy(
    "startup-connect",
    attempts=30,
    base_delay=0.5,
    max_delay=5.0,
    timeout=15.0,
    retry_on=(OSError, asyncio.TimeoutError, nats.errors.Error),
)
"""Compose starts services beside their dependencies: wait up to about two minutes for them."""
DB_HEALTH_TTL = 2.0

Routes = Callable[[web.Application], None]
Hook = Callable[["Service"], Awaitable[None]]


class Service:
    def __init__(
        self,
        name: str,
        cfg: ServiceConfig,
        handlers: Mapping[type[Contract], Handler],
        *,
        default_port: int,
        routes: Routes | None = None,
        on_start: Hook | None = None,
        on_stop: Hook | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        uses_bus: bool = True,
    ) -> None:
        self.name = name
        self.uses_bus = uses_bus or bool(handlers)
        """Whether it connects to NATS (a service that neither consumes nor publishes, the
        router, serves on while NATS is away)."""
        self.max_body_bytes = max_body_bytes
        """Largest request body its HTTP port reads (aiohttp's 413 above)."""
        self.cfg = cfg
        self.handlers = dict(handlers)
        self.port = cfg.http.port or default_port
        self.routes = routes
        self.on_start = on_start
        self.on_stop = on_stop
        self.metrics = ServiceMetrics(name)
        self.bus: NatsBus | None = None
        self.store: Store | None = None
        self._stopping = asyncio.Event()
        self._started = False
        self._exit_code = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._db_ok = (0.0, False)
        self._start_time = time.monotonic()
        self.bound_port: int | None = None
        self._pullers: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------------
    async def run(self, freeze_start_up: bool = False) -> int:
        """Run until SIGTERM/SIGINT (or `stop()`); returns the process exit code.
        `freeze_start_up`: the objects alive once started are never collected (`gc.freeze`),
        for a process that is this service alone (`run_service`), not a test's."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        runner: web.AppRunner | None = None
        pullers: list[asyncio.Task[None]] = []
        try:
            pullers = await self._start()
            self._pullers = pullers
            if freeze_start_up:
                # What start-up made (modules, models, tables) lives as long as the process:
                # kept out of the collector's way, a full collection walks only what serving
                # made. A router's full collections while serving walked 125,000 start-up
                # objects for 108 and 133 ms, every request in flight waiting (26 ms frozen;
                # docs/benchmarks.md, session 24). Garbage first: frozen, it would never go.
                gc.collect()
                gc.freeze()
            runner = await self._serve_http()
            self._started = True
            self.metrics.set_up(True)
            log.info(
                "service started",
                port=self.bound_port,
                consumers=[c.kind() for c in self.handlers],
                frozen_objects=gc.get_freeze_count(),
            )
            await self._stopping.wait()
        finally:
            self._stopping.set()  # also when cancelled: our own close is not a lost connection
            log.info("service stopping", in_flight=len(self._tasks))
            self.metrics.set_up(False)
            await self._drain(pullers)
            if runner is not None:
                # stops listening, then lets the requests in flight finish (`shutdown_grace`)
                # before the hooks close what they use (the router's upstream session)
                await runner.cleanup()
            if self.on_stop is not None:
                await self.on_stop(self)
            if self.bus is not None:
                await self.bus.close()
            if self.store is not None:
                await self.store.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            log.info("service stopped", exit_code=self._exit_code)
        return self._exit_code

    def stop(self, exit_code: int = 0) -> None:
        self._exit_code = self._exit_code or exit_code
        self._stopping.set()

    async def _start(self) -> list[asyncio.Task[None]]:
        nats_url, db_url = await asyncio.to_thread(resolve_urls, self.cfg, nats=self.uses_bus)
        if self.cfg.database.url is None:
            # Embedded mode has no migrations job: bring the schema to head (serialised by a lock).
            await upgrade_async(db_url, self.cfg.database.schema)
        self.store = Store.connect(self.cfg.database, db_url)
        await with_retry(STARTUP_RETRY, self.store.ping)

        async def _closed() -> None:
            if not self._stopping.is_set():
                log.error("nats connection closed for good; exiting")
                self.stop(exit_code=1)

        if nats_url is not None:
            self.bus = await with_retry(
                STARTUP_RETRY,
                lambda: NatsBus.connect(
                    nats_url, self.cfg.nats, name=f"retrace-{self.name}", on_closed=_closed
                ),
            )
            await self.bus.ensure_streams()
        pullers = []
        for contract, handler in self.handlers.items():
            durable = f"{self.name}-{contract.STAGE}-{contract.EVENT}"
            if contract.FAIR:
                pullers.append(
                    asyncio.create_task(
                        self._pull_fair(durable, contract, handler), name=f"pull-{durable}"
                    )
                )
                continue
            assert self.bus is not None  # a service with handlers uses the bus
            stream = await self.bus.ensure_consumer(durable, contract, self.cfg.consumer)
            sub = await self.bus.js.pull_subscribe_bind(durable, stream)
            delivery = Delivery(
                durable, contract, handler, self.bus, self.store, self.cfg.consumer, self.metrics
            )
            pullers.append(asyncio.create_task(self._pull(delivery, sub), name=f"pull-{durable}"))
        if self.on_start is not None:
            await self.on_start(self)
        return pullers

    async def _serve_http(self) -> web.AppRunner:
        runner = await listen(
            build_app(
                self.metrics,
                self.health,
                self.routes,
                self.cfg.http.metrics_key,
                self.max_body_bytes,
            ),
            self.cfg.http.host,
            self.port,
            idle_timeout_s=self.cfg.http.idle_timeout_s,
            shutdown_timeout=self.cfg.consumer.shutdown_grace,
            reuse_port=self.cfg.http.reuse_port,
        )
        addresses = runner.addresses
        self.bound_port = int(addresses[0][1]) if addresses else self.port
        return runner

    async def _drain(self, pullers: list[asyncio.Task[None]]) -> None:
        # A puller inside a fetch may already hold messages the server counts as delivered:
        # cancelled there, it would drop them until their ack timeout. Its loop ends on
        # `_stopping`, so let the fetch return (it hands them to handlers), then cancel the rest
        # (a puller waiting for a free slot holds nothing).
        if pullers:
            _, waiting = await asyncio.wait(pullers, timeout=self.cfg.consumer.fetch_timeout + 1)
            for task in waiting:
                task.cancel()
            await asyncio.gather(*pullers, return_exceptions=True)
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=self.cfg.consumer.shutdown_grace)
            for task in pending:
                task.cancel()  # Delivery naks the message so another instance takes it
            if pending:
                log.warning("in-flight handlers cancelled at shutdown", count=len(pending))
                await asyncio.gather(*pending, return_exceptions=True)

    # -- pulling ---------------------------------------------------------------------------
    async def _pull(self, delivery: Delivery, sub: JetStreamContext.PullSubscription) -> None:
        """Fetch for one consumer while it has fewer than `concurrency` messages in flight.

        Each consumer has its own slots: a long poll on an idle subject must not hold the
        capacity another consumer needs."""
        slots = _Slots(self.cfg.consumer.concurrency)
        while not self._stopping.is_set():
            free = await slots.reserve_free()
            msgs = []
            try:
                msgs = await sub.fetch(batch=free, timeout=self.cfg.consumer.fetch_timeout)
            except TimeoutError:
                # No message this time. nats-py raises both its own TimeoutError and plain
                # asyncio.TimeoutError here; the builtin catches both.
                pass
            except nats.errors.Error as exc:
                log.warning("fetch failed; retrying", consumer=delivery.consumer, error=repr(exc))
                await asyncio.sleep(1.0)
            except Exception as exc:
                log.exception(
                    "unexpected fetch failure; retrying",
                    consumer=delivery.consumer,
                    error=repr(exc),
                )
                await asyncio.sleep(1.0)
            finally:
                await slots.release(free - len(msgs))
            for msg in msgs:
                task = asyncio.create_task(self._run(delivery, msg, slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self.metrics.in_flight.set(len(self._tasks))

    async def _pull_fair(self, durable: str, contract: type[Contract], handler: Handler) -> None:
        """Round robin across tenants: each free slot goes to the next tenant with work waiting,
        through a consumer of that tenant's subject only. A tenant with fifty jobs queued and
        a tenant with one take turns."""
        assert self.bus is not None and self.store is not None
        stream = stream_for(self.cfg.nats, contract)
        if await self.bus.drop_consumer(stream, durable):
            log.info("replaced the all-tenant consumer by per-tenant ones", consumer=durable)
        slots = _Slots(self.cfg.consumer.concurrency)
        bound: dict[str, tuple[Delivery, JetStreamContext.PullSubscription]] = {}
        turn = 0
        poll = min(self.cfg.consumer.fetch_timeout, 0.5)
        while not self._stopping.is_set():
            try:
                waiting = await self.bus.waiting_tenants(contract)
                for tenant in waiting:
                    if tenant not in bound:
                        name = f"{durable}-{tenant}"
                        await self.bus.ensure_consumer(
                            name, contract, self.cfg.consumer, tenant=tenant
                        )
                        sub = await self.bus.js.pull_subscribe_bind(name, stream)
                        delivery = Delivery(
                            name,
                            contract,
                            handler,
                            self.bus,
                            self.store,
                            self.cfg.consumer,
                            self.metrics,
                        )
                        bound[tenant] = (delivery, sub)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("fair pull: listing tenants failed", error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            except Exception as exc:  # the puller must not die: log, pause, go on
                log.exception("fair pull: unexpected failure", consumer=durable, error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            if not waiting:
                await asyncio.sleep(poll)
                continue
            got = 0
            order = waiting[turn % len(waiting) :] + waiting[: turn % len(waiting)]
            turn += 1
            for tenant in order:
                await slots.reserve(1)
                delivery, sub = bound[tenant]
                try:
                    msgs = await sub.fetch(batch=1, timeout=poll)
                except TimeoutError:
                    msgs = []
                except nats.errors.Error as exc:
                    log.warning("fair pull: fetch failed", tenant=tenant, error=repr(exc))
                    msgs = []
                if not msgs:
                    await slots.release(1)
                    continue
                got += 1
                task = asyncio.create_task(self._run(delivery, msgs[0], slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                self.metrics.in_flight.set(len(self._tasks))
            if not got:
                await asyncio.sleep(poll)  # only in-flight work is waiting: let it finish

    async def _run(self, delivery: Delivery, msg: Msg, slots: _Slots) -> None:
        try:
            await delivery.process(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("delivery failed outside the handler", error=repr(exc))
        finally:
            await slots.release(1)

    # -- health --------------------------------------------------------------------------
    async def health(self) -> Health:
        nats_ok = self.bus is not None and self.bus.connected if self.uses_bus else None
        db_ok = await self._database_ok()
        if self._stopping.is_set():
            status = "stopping"
        elif not self._started:
            status = "starting"
        else:
            pulling = all(not t.done() for t in self._pullers)
            status = "ok" if nats_ok is not False and db_ok and pulling else "degraded"
        self.metrics.set_up(status == "ok")
        return Health(
            service=self.name,
            status=status,
            nats=nats_ok,
            database=db_ok,
            in_flight=len(self._tasks),
            consumers=[c.kind() for c in self.handlers],
            uptime_s=uptime_since(self._start_time),
            pid=os.getpid(),
        )

    async def _database_ok(self) -> bool:
        checked_at, ok = self._db_ok
        if time.monotonic() - checked_at < DB_HEALTH_TTL or self.store is None:
            return ok and self.store is not None
        try:
            await asyncio.wait_for(self.store.ping(), timeout=2.0)
            ok = True
        except Exception as exc:  # noqa: BLE001  boundary: any failure means "not healthy", reported below
            log.warning("database health check failed", error=repr(exc))
            ok = False
        self._db_ok = (time.monotonic(), ok)
        return ok


class _Slots:
    """In-flight accounting for one consumer: a fetch reserves the free slots it may fill."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = asyncio.Condition()

    async def reserve_free(self) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used < self.limit)
            free = self.limit - self.used
            self.used += free
            return free

    async def reserve(self, count: int) -> None:
        """Wait until `count` slots are free and take them."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.limit - self.used >= count)
            self.used += count

    async def release(self, count: int) -> None:
        if count <= 0:
            return
        async with self._changed:
            self.used -= count
            self._changed.notify_all()
