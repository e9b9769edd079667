"""`retrace status`: services' health, queue depths, dead letters and cycles, in one report."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import nats
from sqlalchemy import func, select

from shared.cli.context import RunState
from shared.cli.work import WorkView, running
from shared.config import ServiceConfig
from shared.store import Store
from shared.store.models import Agent, Cycle

HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


class ServiceStatus(msgspec.Struct, kw_only=True):
    name: str
    port: int
    status: str
    """ok | degraded | starting | stopping | down"""
    in_flight: int = 0
    pid: int | None = None


class QueueStatus(msgspec.Struct, kw_only=True):
    stream: str
    consumer: str
    pending: int
    in_flight: int
    redelivered: int


class ActiveCycle(msgspec.Struct, kw_only=True):
    tenant: str
    agent: str
    cycle: str
    state: str
    trigger: str
    age_s: float
    """Seconds since the cycle last changed state."""


class Report(msgspec.Struct, kw_only=True):
    running: bool
    services: list[ServiceStatus]
    queues: list[QueueStatus]
    dead_letters: int | None
    cycles: dict[str, int]
    errors: list[str]
    active: list[ActiveCycle] = msgspec.field(default_factory=list)
    """Cycles under way, with their stage."""
    work: list[WorkView] = msgspec.field(default_factory=list)
    """Long jobs under way (rollout batches, training, prompt optimisation), with progress."""

    @property
    def healthy(self) -> bool:
        return self.running and all(s.status == "ok" for s in self.services)


async def _service(
    session: aiohttp.ClientSession, host: str, name: str, port: int
) -> ServiceStatus:
    try:
        async with session.get(f"http://{host}:{port}/healthz", timeout=HEALTH_TIMEOUT) as resp:
            body = await resp.json(content_type=None)
            return ServiceStatus(
                name=name,
                port=port,
                status=str(body.get("status", "down")),
                in_flight=int(body.get("in_flight", 0)),
                pid=body.get("pid"),
            )
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return ServiceStatus(name=name, port=port, status="down")


async def _queues(url: str, cfg: ServiceConfig) -> tuple[list[QueueStatus], int | None]:
    # Two tries at most, quietly: nats-py reads max_reconnect_attempts=0 as "never stop" (the
    # command hung) and logs a traceback for every failed try; the report says what failed.
    failures: list[Exception] = []

    async def note(exc: Exception) -> None:
        failures.append(exc)

    try:
        nc = await nats.connect(
            url,
            connect_timeout=cfg.nats.connect_timeout,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=note,
        )
    except nats.errors.NoServersError as exc:
        raise ConnectionError(str(failures[-1]) if failures else "no server answered") from exc
    try:
        js = nc.jetstream(timeout=cfg.nats.request_timeout)
        queues: list[QueueStatus] = []
        dead: int | None = None
        for kind in ("EVENTS", "WORK"):
            stream = f"{cfg.nats.stream_prefix}_{kind}"
            try:
                for info in await js.consumers_info(stream):
                    queues.append(
                        QueueStatus(
                            stream=stream,
                            consumer=info.name,
                            pending=info.num_pending or 0,
                            in_flight=info.num_ack_pending or 0,
                            redelivered=info.num_redelivered or 0,
                        )
                    )
            except nats.js.errors.NotFoundError:
                continue
        try:
            dead = (await js.stream_info(f"{cfg.nats.stream_prefix}_DLQ")).state.messages
        except nats.js.errors.NotFoundError:
            dead = 0
        return sorted(queues, key=lambda q: q.consumer), dead
    finally:
        await nc.close()


async def _cycles(store: Store) -> tuple[dict[str, int], list[ActiveCycle]]:
    async with store.cross_tenant() as session:
        rows = await session.execute(select(Cycle.state, func.count()).group_by(Cycle.state))
        counts = {state: count for state, count in rows}
        active = await session.execute(
            select(
                Cycle.tenant_id,
                Agent.name,
                Cycle.id,
                Cycle.state,
                Cycle.trigger,
                func.extract("epoch", func.now() - Cycle.updated_at),
            )
            .join(Agent, Agent.id == Cycle.agent_id)
            .where(Cycle.state.not_in(("completed", "failed")))
            .order_by(Cycle.created_at)
        )
        return counts, [
            ActiveCycle(
                tenant=tenant,
                agent=agent,
                cycle=str(cycle_id),
                state=state,
                trigger=trigger,
                age_s=round(float(age), 1),
            )
            for tenant, agent, cycle_id, state, trigger, age in active
        ]


async def collect(
    cfg: ServiceConfig, state: RunState | None, nats_url: str | None, db_url: str | None
) -> Report:
    errors: list[str] = []
    services: list[ServiceStatus] = []
    if state is not None:
        async with aiohttp.ClientSession() as session:
            services = list(
                await asyncio.gather(
                    *(_service(session, state.host, n, p) for n, p in state.services.items())
                )
            )
    else:
        errors.append("no `retrace up` is running for this data directory")
    queues: list[QueueStatus] = []
    dead: int | None = None
    if nats_url:
        try:
            queues, dead = await _queues(nats_url, cfg)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            errors.append(f"NATS unreachable at {nats_url}: {exc!r}")
    cycles: dict[str, int] = {}
    active: list[ActiveCycle] = []
    work: list[WorkView] = []
    if db_url:
        store = Store.connect(cfg.database, db_url)
        try:
            cycles, active = await _cycles(store)
            async with store.cross_tenant() as session:
                work = await running(session)
        except Exception as exc:  # noqa: BLE001  boundary: any database failure is reported
            errors.append(f"Postgres unreachable: {exc!r}")
        finally:
            await store.close()
    return Report(
        running=state is not None,
        services=services,
        queues=queues,
        dead_letters=dead,
        cycles=cycles,
        errors=errors,
        active=active,
        work=work,
    )
