"""Synthesize + rollout for an agent on a plug-in target (examples/hotel_desk): the capability
gets a derived environment (the target's own tasks in new seeded worlds, graded with the
capability's check), calibrated through the real rollout service like any other; and the same
hotel behind the HTTP protocol, whose derived environment replays snapshots with simulated
tools."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiohttp.test_utils import TestServer
from retrace_hotel_desk.env import HotelDesk
from sqlalchemy import select

from services.rollout.config import RolloutConfig
from services.rollout.service import build as build_rollout
from services.synthesize.config import SynthesizeConfig
from services.synthesize.service import build as build_synthesize
from shared.bus import NatsBus
from shared.config import ModelConfig, ServiceConfig
from shared.envs.remote.server import environment_app
from shared.messages import CapabilitiesIdentified
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Capability, Environment, Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually, healthy
from tests.support.oracle_llm import OracleLLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _fields(cfg: ServiceConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


async def _synthesized(
    service_cfg: ServiceConfig, store: Store, target: str, max_regenerations: int
) -> None:
    """Agent `desk` on `target` with `valid_tool_arguments` identified: the rollout and
    synthesize services run until its environment is ready or failed. The model is the
    oracle: it plays each request's reference, found in the target's world 0 (in other
    worlds it may book the wrong room or miss a reservation), and half its samples refuse."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "desk", model="oracle", environment=target)
        capability = Capability(
            agent_id=agent.id,
            name="valid_tool_arguments",
            definition="Tool calls carry schema-valid arguments.",
            status="identified",
        )
        session.add(capability)
        await session.flush()
        agent_id, capability_id = agent.id, capability.id
    oracle = TestServer(OracleLLM(HotelDesk(), fail_rate=0.5).app())
    await oracle.start_server()
    url = f"http://127.0.0.1:{oracle.port}/v1"
    services = [
        build_rollout(RolloutConfig(**{**_fields(service_cfg), "model": ModelConfig(url=url)})),  # type: ignore[arg-type]
        build_synthesize(
            SynthesizeConfig(
                calibration_tasks=8, calibration_samples=4, max_regenerations=max_regenerations,  # type: ignore[arg-type]
                **_fields(service_cfg),
            )
        ),
    ]  # fmt: skip
    runs = [asyncio.create_task(s.run()) for s in services]
    for s in services:
        await eventually(lambda s=s: healthy(s))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.publish(
        "acme",
        CapabilitiesIdentified(agent_id=agent_id, capability_ids=[capability_id]),
        msg_id=f"caps-{uuid.uuid4()}",
    )

    async def settled() -> bool:
        async with store.tenant("acme") as session:
            rows = list(
                await session.scalars(select(Environment).where(Environment.kind == "synthetic"))
            )
        return any(r.status in ("ready", "failed") for r in rows)

    await eventually(settled, within=180)
    for s in services:
        s.stop()
    await asyncio.gather(*runs)
    await bus.close()
    await oracle.close()


async def test_a_plugin_target_gets_a_derived_environment(
    service_cfg: ServiceConfig, store: Store
) -> None:
    await _synthesized(service_cfg, store, "hotel-desk", max_regenerations=1)
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(
                select(Environment)
                .where(Environment.kind == "synthetic")
                .order_by(Environment.version)
            )
        )
        rewards = list(
            await session.scalars(
                select(Trajectory.reward).where(Trajectory.environment_id == rows[0].id)
            )
        )
    first = rows[0]
    assert first.name == "synthetic/valid_tool_arguments-on-hotel-desk"
    assert first.spec["kind"] == "derived" and first.spec["target"] == "hotel-desk"
    assert first.spec["check"] == "valid_tool_arguments"
    assert first.calibration["result"]["rollouts"] == 32
    assert len(rewards) == 32 and len(set(rewards)) > 1  # graded, and not all alike


class CountingDesk(HotelDesk):
    """The hotel desk, counting the episodes started through it."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self, task, seed):  # type: ignore[no-untyped-def]
        self.resets += 1
        return super().reset(task, seed)


async def test_an_http_target_gets_a_derived_environment_with_simulated_tools(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """The same hotel behind the HTTP environment protocol: synthesis takes each chosen
    task's opening from the server once, and calibration plays them with simulated tool
    results (the server is not asked again), graded by the capability check alone."""
    desk = CountingDesk()
    server = TestServer(environment_app(desk))
    await server.start_server()
    target = f"http://127.0.0.1:{server.port}"
    try:
        await _synthesized(service_cfg, store, target, max_regenerations=0)
    finally:
        await server.close()
    async with store.tenant("acme") as session:
        [row] = list(await session.scalars(select(Environment)))
        trajectories = list(
            await session.scalars(select(Trajectory).where(Trajectory.environment_id == row.id))
        )
    spec = row.spec
    assert spec["kind"] == "derived" and spec["target"] == target
    assert spec["check"] == "valid_tool_arguments" and spec["check_weight"] == 1.0
    snapshots = spec["simulated"]
    assert [s["task_id"] for s in snapshots] == spec["task_ids"]
    local = HotelDesk()
    assert snapshots[0]["tools"] == local.reset(local.tasks()[0], 0).tools  # exactly the target's
    assert desk.resets == len(spec["task_ids"])  # openings only: no episode played on the server
    assert row.calibration["result"]["rollouts"] == 32 and len(trajectories) == 32
    rewards = {t.reward for t in trajectories}
    assert rewards <= {0.0, 1.0} and len(rewards) == 2  # each sample called validly, or not at all
