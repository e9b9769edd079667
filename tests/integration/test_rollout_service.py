"""The rollout service on real NATS and Postgres, against a fake model that plays references."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import func, select

from services.rollout.config import RolloutConfig
from services.rollout.service import build
from shared.bus import NatsBus
from shared.cli.work import cancel
from shared.config import ModelConfig, ServiceConfig
from shared.envs import registry
from shared.envs.registry import get_environment
from shared.messages import RolloutCompleted, RolloutRequested, Sampling
from shared.reports import summarise_request
from shared.runtime.service import Service
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Task, Trajectory, Work
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import dead_letters, eventually
from tests.support.oracle_llm import OracleLLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOOLBOX = get_environment("toolbox")
TASKS = [t.id for t in TOOLBOX.tasks() if t.split == "train"][:6]
FAILING = {TASKS[1], TASKS[4]}


def rollout_cfg(base: ServiceConfig, model_url: str, **extra: object) -> RolloutConfig:
    fields = {f: getattr(base, f) for f in base.__struct_fields__}
    return RolloutConfig(
        **{**fields, "model": ModelConfig(url=model_url, request_timeout=30)}, **extra
    )


@pytest.fixture
async def agent_id(store: Store) -> uuid.UUID:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(
            session, "bot", model="oracle", environment="toolbox", system_prompt="Be precise."
        )
        return agent.id


@pytest.fixture
async def oracle() -> AsyncIterator[tuple[OracleLLM, str]]:
    fake = OracleLLM(TOOLBOX, fail=FAILING)
    server = TestServer(fake.app())
    await server.start_server()
    yield fake, f"http://127.0.0.1:{server.port}/v1"
    await server.close()


async def start(cfg: RolloutConfig) -> tuple[Service, asyncio.Task[int]]:
    service = build(cfg)
    task = asyncio.create_task(service.run())

    async def ready() -> bool:
        return (await service.health()).status == "ok"

    await eventually(ready)
    return service, task


async def completed(bus: NatsBus, request_id: uuid.UUID) -> list[RolloutCompleted]:
    sub = await bus.js.pull_subscribe(
        f"{bus.cfg.subject_prefix}.acme.rollout.completed", stream=f"{bus.cfg.stream_prefix}_EVENTS"
    )
    out = []
    try:
        for m in await sub.fetch(10, timeout=1):
            event = msgspec.json.decode(m.data, type=RolloutCompleted)
            if event.request_id == request_id:
                out.append(event)
    except Exception:  # noqa: BLE001  a fetch timeout means no (more) messages
        pass
    await sub.unsubscribe()
    return out


async def requested(
    bus: NatsBus,
    agent_id: uuid.UUID,
    environment: str = "toolbox",
    within: float = 60,
    **fields: object,
) -> uuid.UUID:
    """Publish a greedy rollout request with `fields`; its id once it completed."""
    request_id = uuid.uuid4()
    await bus.publish(
        "acme",
        RolloutRequested(
            request_id=request_id,
            agent_id=agent_id,
            environment=environment,
            sampling=Sampling(temperature=0),
            **fields,  # type: ignore[arg-type]
        ),
        msg_id=str(request_id),
    )

    async def events() -> bool:
        return len(await completed(bus, request_id)) == 1

    await eventually(events, within=within)
    return request_id


async def test_rollout_stores_every_episode_and_reports(
    service_cfg: ServiceConfig, store: Store, agent_id: uuid.UUID, oracle: tuple[OracleLLM, str]
) -> None:
    _, url = oracle
    service, run = await start(rollout_cfg(service_cfg, url))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    request_id = await requested(bus, agent_id, task_ids=TASKS, trials=2)
    [event] = await completed(bus, request_id)
    assert event.trajectories == 12 and event.successes == 8
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
        )
        summary = await summarise_request(session, request_id)
        stored_tasks = await session.scalar(select(func.count()).select_from(Task))
    assert stored_tasks == len(TOOLBOX.tasks())  # the whole environment was imported once
    assert len(rows) == 12
    for row in rows:
        assert row.messages[0]["role"] == "system" and row.messages[0]["content"].startswith(
            "Be precise."
        )
        assert row.model == "oracle" and row.source == "rollout"
        assert 0.0 <= (row.reward or 0) <= 1.0 and "checks" in row.reward_breakdown
    assert summary.overall.episodes == 12 and summary.overall.successes == 8
    assert summary.pass_hat_k[2] == pytest.approx(4 / 6)
    service.stop()
    assert await run == 0
    await bus.close()


async def test_restart_mid_batch_neither_loses_nor_duplicates(
    service_cfg: ServiceConfig, store: Store, agent_id: uuid.UUID
) -> None:
    slow = OracleLLM(TOOLBOX, delay=1.5)
    server = TestServer(slow.app())
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}/v1"
    cfg = rollout_cfg(service_cfg, url, episodes_at_once=2)
    first, run = await start(cfg)
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    request_id = uuid.uuid4()
    await bus.publish(
        "acme",
        RolloutRequested(
            request_id=request_id,
            agent_id=agent_id,
            environment="toolbox",
            task_ids=TASKS,
            trials=2,
        ),
        msg_id=str(request_id),
    )

    async def stored() -> int:
        async with store.tenant("acme") as session:
            return (
                await session.scalar(
                    select(func.count())
                    .select_from(Trajectory)
                    .where(Trajectory.request_id == request_id)
                )
                or 0
            )

    async def some() -> bool:
        return await stored() >= 3

    await eventually(some, within=60)
    first.stop()  # grace is 5 s in service_cfg; the rest of the batch is cut off and handed back
    await run
    partial = await stored()
    assert 3 <= partial < 12
    assert (await work(store, request_id)).state == "stopped"  # handed back, not cancelled

    second, run2 = await start(cfg)

    async def all_done() -> bool:
        return len(await completed(bus, request_id)) >= 1

    await eventually(all_done, within=90)
    assert await stored() == 12
    done = await work(store, request_id)
    assert (done.state, done.done, done.total) == ("finished", 12, 12)
    second.stop()
    await run2
    await bus.close()
    await server.close()


@pytest.mark.parametrize(
    ("environment", "adapter"),
    [("toolbox", "not-loaded"), ("nowhere", None)],
    ids=["unknown-model", "unknown-environment"],
)
async def test_unservable_requests_are_dead_lettered(
    service_cfg: ServiceConfig,
    agent_id: uuid.UUID,
    oracle: tuple[OracleLLM, str],
    environment: str,
    adapter: str | None,
) -> None:
    _, url = oracle
    service, run = await start(rollout_cfg(service_cfg, url))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.publish(
        "acme",
        RolloutRequested(
            request_id=uuid.uuid4(),
            agent_id=agent_id,
            environment=environment,
            split="train",
            adapter=adapter,
        ),
        msg_id=f"bad-{environment}-{adapter}",
    )

    async def dead() -> bool:
        return (await bus.js.stream_info(f"{bus.cfg.stream_prefix}_DLQ")).state.messages == 1

    await eventually(dead)
    service.stop()
    await run
    await bus.close()


async def test_a_request_can_cap_the_turns_below_the_service_limit(
    service_cfg: ServiceConfig, store: Store, agent_id: uuid.UUID, oracle: tuple[OracleLLM, str]
) -> None:
    """Calibration asks for the turns GRPO will give (RolloutRequested.max_turns): the
    reference answers need a tool call and a reply, so one turn cannot finish them."""
    _, url = oracle
    service, run = await start(rollout_cfg(service_cfg, url))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    turns: dict[int | None, list[int]] = {}
    for cap in (None, 1):
        passing = [t for t in TASKS if t not in FAILING][:3]
        request_id = await requested(bus, agent_id, task_ids=passing, max_turns=cap)
        async with store.tenant("acme") as session:
            rows = await session.scalars(
                select(Trajectory).where(Trajectory.request_id == request_id)
            )
            turns[cap] = [sum(1 for m in row.messages if m["role"] == "assistant") for row in rows]
    assert len(turns[None]) == len(turns[1]) == 3
    assert min(turns[None]) >= 2 and turns[1] == [1, 1, 1]
    service.stop()
    assert await run == 0
    await bus.close()


async def test_an_endpoint_not_up_yet_is_waited_for_without_spending_attempts(
    service_cfg: ServiceConfig, store: Store, agent_id: uuid.UUID
) -> None:
    """The model server is still starting when the request arrives (connections refused for
    longer than the service's deliveries would last): the request waits for it, heartbeating,
    and completes on its first delivery."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    service, run = await start(rollout_cfg(service_cfg, f"http://127.0.0.1:{port}/v1"))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    server = TestServer(OracleLLM(TOOLBOX, fail=FAILING).app(), port=port)

    async def late_start() -> None:
        await asyncio.sleep(8.0)
        await server.start_server()

    starting = asyncio.create_task(late_start())
    try:
        await requested(bus, agent_id, task_ids=TASKS[:2], trials=1)
        retried = service.metrics.handled.labels(RolloutRequested.kind(), "retried")._value.get()
        assert retried == 0
        assert await dead_letters(bus) == []
    finally:
        await starting
        service.stop()
        assert await run == 0
        await bus.close()
        await server.close()


async def work(store: Store, work_id: uuid.UUID) -> Work:
    async with store.tenant("acme") as session:
        row = await session.get(Work, work_id)
    assert row is not None, f"no work row for {work_id}"
    return row


async def test_a_cancelled_batch_stops_keeps_what_it_stored_and_is_not_retried(
    service_cfg: ServiceConfig, store: Store, agent_id: uuid.UUID
) -> None:
    slow = OracleLLM(TOOLBOX, delay=0.5)
    server = TestServer(slow.app())
    await server.start_server()
    cfg = rollout_cfg(service_cfg, f"http://127.0.0.1:{server.port}/v1", episodes_at_once=2)
    service, run = await start(cfg)
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    request_id = uuid.uuid4()
    await bus.publish(
        "acme",
        RolloutRequested(
            request_id=request_id, agent_id=agent_id, environment="toolbox", task_ids=TASKS,
            trials=2,
        ),
        msg_id=str(request_id),
    )  # fmt: skip

    async def stored() -> list[Trajectory]:
        async with store.tenant("acme") as session:
            return list(
                await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
            )

    async def some() -> bool:
        return len(await stored()) >= 2 and (await work(store, request_id)).done >= 1

    try:
        await eventually(some, within=60)
        progress = await work(store, request_id)
        assert progress.kind == "rollout" and progress.total == 12 and progress.state == "running"
        async with store.tenant("acme") as session:
            what, flagged, ended = await cancel(session, request_id)
        assert flagged == [request_id] and ended is None and "rollout" in what

        async def cancelled() -> bool:
            return (await work(store, request_id)).state == "cancelled"

        await eventually(cancelled, within=30)
        kept = await stored()
        await asyncio.sleep(3)  # nothing more is played: not retried, not resumed
        assert len(await stored()) == len(kept) < 12
        assert all(t.messages and t.reward is not None for t in kept)  # each one whole
        assert await completed(bus, request_id) == []
        assert await dead_letters(bus) == []
        assert (await service.health()).status == "ok"
    finally:
        service.stop()
        await run
        await bus.close()
        await server.close()


async def test_episodes_the_environment_broke_are_stored_ungraded_and_counted_apart(
    service_cfg: ServiceConfig, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring raises on the hotel desk's `book` tasks: those episodes are kept without a
    reward or verdict, counted as environment errors, and left out of every rate."""
    from retrace_hotel_desk.env import HotelDesk

    class ScoringBreaksOnBookings(HotelDesk):  # keeps the name: the same seeded worlds
        def reward(self, task, transcript):  # type: ignore[no-untyped-def]
            if task.kind == "book":
                raise RuntimeError("the price list is unreadable")
            return super().reward(task, transcript)

    monkeypatch.setitem(registry.BUILTIN, "broken-desk", ScoringBreaksOnBookings)
    registry.get_environment.cache_clear()
    desk = ScoringBreaksOnBookings()
    tasks = [t for t in desk.tasks() if t.split == "train"]
    chosen = [t.id for t in tasks if t.kind == "book"][:2] + [
        t.id for t in tasks if t.kind == "cancel"
    ][:2]
    server = TestServer(OracleLLM(desk).app())
    await server.start_server()
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "desk", model="oracle", environment="broken-desk")
    service, run = await start(rollout_cfg(service_cfg, f"http://127.0.0.1:{server.port}/v1"))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    request_id = await requested(bus, agent.id, "broken-desk", task_ids=chosen)
    [event] = await completed(bus, request_id)
    assert (event.trajectories, event.successes, event.env_errors) == (4, 2, 2)
    assert event.mean_reward == pytest.approx(1.0)
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
        )
        summary = await summarise_request(session, request_id)
    broken = [r for r in rows if r.reward is None]
    assert len(broken) == 2 and all(r.success is None for r in broken)
    for row in broken:
        assert row.reward_breakdown["env_error"] is True
        assert "the price list is unreadable" in row.reward_breakdown["error"]
    assert summary.env_errors == 2 and summary.overall.episodes == 2
    assert summary.overall.successes == 2
    service.stop()
    assert await run == 0
    await bus.close()
    await server.close()
    registry.get_environment.cache_clear()
