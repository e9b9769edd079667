"""The rollout service runs tau2:retail episodes and stores them with tau2's reward breakdown.

Both model endpoints are one fake (the agent apologises, the user simulator asks once and then
stops); the real counterpart is tests/model/test_tau2_real_model.py, SmolLM2 on both sides.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import select

from services.rollout.config import RolloutConfig
from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.envs.registry import get_environment
from shared.messages import RolloutRequested, Sampling
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Environment, Task, Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually
from tests.integration.test_rollout_service import rollout_cfg, start
from tests.support.fake_chat import FakeJudge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
REF = "tau2:retail"
TALK_ONLY = "10"  # no gold write and nothing to communicate: talking alone passes
EXCHANGE = "0"  # an exchange is due: talking alone leaves the database wrong


def answer(body: dict[str, Any]) -> str:
    system = str(body["messages"][0]["content"])
    if "<scenario>" in system:  # tau2's user-simulator prompt
        return "I need help with an order." if len(body["messages"]) == 2 else "###STOP###"
    return "Sorry, I cannot help with that."


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[FakeJudge, str]]:
    fake = FakeJudge(answer)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    app.router.add_get("/v1/models", models)
    server = TestServer(app)
    await server.start_server()
    yield fake, f"http://127.0.0.1:{server.port}/v1"
    await server.close()


@pytest.fixture
def tau2_user_at(
    endpoint: tuple[FakeJudge, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The environment reads `RETRACE_TAU2_*` once, when built: build it afresh for this test."""
    monkeypatch.setenv("RETRACE_TAU2_USER_URL", endpoint[1])
    monkeypatch.setenv("RETRACE_TAU2_USER_MODEL", "fake")
    get_environment.cache_clear()
    yield
    get_environment.cache_clear()


@pytest.mark.usefixtures("tau2_user_at")
async def test_rollout_stores_tau2_trajectories_with_breakdown(
    service_cfg: ServiceConfig, store: Store, endpoint: tuple[FakeJudge, str]
) -> None:
    fake, url = endpoint
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="fake", environment=REF)
    cfg: RolloutConfig = rollout_cfg(service_cfg, url)
    service, run = await start(cfg)
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    request_id = uuid.uuid4()
    try:
        await bus.publish(
            "acme",
            RolloutRequested(
                request_id=request_id,
                agent_id=agent.id,
                environment=REF,
                task_ids=[TALK_ONLY, EXCHANGE],
                sampling=Sampling(temperature=0),
            ),
            msg_id=str(request_id),
        )

        async def stored() -> bool:
            async with store.tenant("acme") as session:
                rows = await session.scalars(
                    select(Trajectory).where(Trajectory.request_id == request_id)
                )
                return len(list(rows)) == 2

        await eventually(stored, within=90)
    finally:
        await bus.close()
        service.stop()
        await run
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
        )
        tasks = {t.id: t for t in await session.scalars(select(Task))}
        env_names = set(await session.scalars(select(Environment.name)))
    assert env_names == {REF}
    by_task = {tasks[r.task_id].external_id: r for r in rows}
    assert {k: tasks[r.task_id].split for k, r in by_task.items()} == {
        TALK_ONLY: "train",
        EXCHANGE: "train",
    }
    talk, exchange = by_task[TALK_ONLY], by_task[EXCHANGE]
    assert (talk.reward, talk.success) == (1.0, True)
    assert (exchange.reward, exchange.success) == (0.0, False)
    assert talk.reward_breakdown["checks"] == {"db": 1.0, "communicate": 1.0}
    assert exchange.reward_breakdown["checks"] == {"db": 0.0, "communicate": 1.0}
    assert any("exchange_delivered_order_items" in n for n in exchange.reward_breakdown["notes"])
    # tau2's opening (greeting, then the simulated user) is what was stored and sent.
    assert [m["role"] for m in talk.messages[:3]] == ["system", "assistant", "user"]
    assert talk.messages[-1]["content"] == "###STOP###"
    assert any("<scenario>" in str(r["messages"][0]["content"]) for r in fake.requests)
