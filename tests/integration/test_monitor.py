"""The failure-rate monitor on real Postgres and NATS: failing production conversations
with feedback request one cycle (trigger `monitor`, the numbers as the reason), not one per
pass; the state it keeps survives in the agent's config."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text, update

from services.evaluator.monitor import MonitorConfig, tick
from services.evaluator.stall import expire_stalled, limits
from shared.bus import NatsBus
from shared.config import NatsConfig
from shared.messages import CycleCompleted, CycleRequested
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Agent, Cycle, Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_cycle import emitted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def test_failing_production_requests_one_cycle(store: Store, nats_cfg: NatsConfig) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        quiet = await create_agent(session, "quiet", model="smollm2", environment="toolbox")
        for i in range(12):
            session.add(
                Trajectory(agent_id=agent.id, source="production", success=i % 4 == 0, reward=0.0)
            )
            session.add(  # no feedback: does not count
                Trajectory(agent_id=quiet.id, source="production", success=None)
            )
        agent_id = agent.id
    bus = await NatsBus.connect(nats_cfg.url or "", nats_cfg)
    await bus.ensure_streams()
    cfg = MonitorConfig(window=20, min_samples=10, threshold=0.5, rearm=0.3, cooldown_s=60)
    try:
        assert await tick(store, bus, cfg, now=1000.0) == 1
        assert await tick(store, bus, cfg, now=1001.0) == 0  # disarmed: not one per pass
        [request] = await emitted(bus, f"{nats_cfg.stream_prefix}_EVENTS", CycleRequested)
    finally:
        await bus.close()
    assert request.agent_id == agent_id and request.trigger == "monitor"  # type: ignore[attr-defined]
    assert "75%" in request.reason  # type: ignore[attr-defined]
    async with store.tenant("acme") as session:
        row = await session.scalar(select(Agent).where(Agent.id == agent_id))
    assert row is not None and row.config["monitor"] == {"armed": False, "last_fired": 1000.0}


async def test_a_stalled_cycle_is_failed_saying_where(store: Store, nats_cfg: NatsConfig) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        old = Cycle(agent_id=agent.id, state="training")
        session.add(old)
        await session.flush()
        await session.execute(
            update(Cycle)
            .where(Cycle.id == old.id)
            .values(updated_at=func.now() - text("interval '2 hours'"))
        )
        slow = await create_agent(session, "slow", model="smollm2", environment="toolbox")
        patient = Cycle(agent_id=slow.id, state="diagnosing")  # as old, under a longer limit
        session.add(patient)
        await session.flush()
        await session.execute(
            update(Cycle)
            .where(Cycle.id == patient.id)
            .values(updated_at=func.now() - text("interval '2 hours'"))
        )
        other = await create_agent(session, "fresh", model="smollm2", environment="toolbox")
        session.add(Cycle(agent_id=other.id, state="training"))
        old_id = old.id
    bus = await NatsBus.connect(nats_cfg.url or "", nats_cfg)
    await bus.ensure_streams()
    stall_s = limits(3600, {"diagnosing": 3 * 3600})
    try:
        assert await expire_stalled(store, bus, stall_s) == 1
        assert await expire_stalled(store, bus, stall_s) == 0
        [done] = await emitted(bus, f"{nats_cfg.stream_prefix}_EVENTS", CycleCompleted)
    finally:
        await bus.close()
    assert done.cycle_id == old_id and done.outcome == "failed"  # type: ignore[attr-defined]
    async with store.tenant("acme") as session:
        states = {c.id: c.state for c in await session.scalars(select(Cycle))}
        row = await session.get(Cycle, old_id)
    assert sorted(states.values()) == ["diagnosing", "failed", "training"]
    assert row is not None and "stalled in training" in (row.error or "")


async def test_a_requested_cycle_the_evaluator_never_took_is_failed_within_the_hour(
    store: Store, nats_cfg: NatsConfig
) -> None:
    """A cycle the control API recorded whose request was never taken (dead-lettered, or
    the evaluator down): it held the agent and the tenant's quota for a day."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        waiting = Cycle(agent_id=agent.id, state="requested")
        session.add(waiting)
        await session.flush()
        await session.execute(
            update(Cycle)
            .where(Cycle.id == waiting.id)
            .values(updated_at=func.now() - text("interval '2 hours'"))
        )
        waiting_id = waiting.id
    bus = await NatsBus.connect(nats_cfg.url or "", nats_cfg)
    await bus.ensure_streams()
    try:  # the evaluator's default: a day for a stage, an hour for a request
        assert await expire_stalled(store, bus, limits(86_400, {"requested": 3600})) == 1
    finally:
        await bus.close()
    async with store.tenant("acme") as session:
        row = await session.get(Cycle, waiting_id)
    assert row is not None and row.state == "failed" and "stalled in requested" in (row.error or "")
