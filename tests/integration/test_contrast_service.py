"""The contrast service on real NATS and Postgres: a planted diagnosis rollout in, capabilities
with statistics and evidence out, test-split trajectories never used."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from sqlalchemy import select

from services.contrast.config import ContrastConfig
from services.contrast.service import build
from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.messages import CapabilitiesIdentified, RolloutCompleted
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Capability, Environment, Task, Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually, healthy
from tests.support.planted_trajectories import episode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@contextlib.asynccontextmanager
async def running_contrast(service_cfg: ServiceConfig, **settings: Any) -> AsyncIterator[NatsBus]:
    """The contrast service on the test's NATS and Postgres, with `settings` over the test
    config's; yields a bus client, and stops the service (which must exit cleanly) after."""
    fields = {f: getattr(service_cfg, f) for f in service_cfg.__struct_fields__}
    service = build(ContrastConfig(**{**fields, **settings}))
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    try:
        yield bus
    finally:
        service.stop()
        assert await run == 0
        await bus.close()


async def _plant(store: Store, request_id: uuid.UUID) -> uuid.UUID:
    """40 failures (80% with rejected arguments) and 40 successes (10%), on train tasks; plus
    10 test-split trajectories with the opposite pattern, which must be ignored."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="m", environment="planted")
        env = Environment(name="planted", kind="target", spec={})
        session.add(env)
        await session.flush()
        rng = random.Random(0)
        plan = [(False, i < 32, "train") for i in range(40)] + [
            (True, i < 4, "train") for i in range(40)
        ]
        plan += [(True, True, "test") for _ in range(10)]
        for n, (success, cause, split) in enumerate(plan):
            task = Task(
                environment_id=env.id, external_id=f"t-{n:03d}", split=split, kind="planted"
            )
            session.add(task)
            await session.flush()
            stored = episode(cause=cause, asks=rng.random() < 0.5).stored(f"x{n}", success)
            session.add(
                Trajectory(
                    agent_id=agent.id,
                    request_id=request_id,
                    task_id=task.id,
                    environment_id=env.id,
                    trial=0,
                    messages=stored["messages"],
                    reward=stored["reward"],
                    success=success,
                    reward_breakdown=stored["reward_breakdown"],
                )
            )
        return agent.id


async def test_diagnosis_finds_the_planted_capability(
    service_cfg: ServiceConfig, store: Store
) -> None:
    request_id = uuid.uuid4()
    agent_id = await _plant(store, request_id)
    async with running_contrast(service_cfg) as bus:
        done = RolloutCompleted(
            request_id=request_id,
            agent_id=agent_id,
            trajectories=90,
            successes=50,
            mean_reward=0.5,
            purpose="diagnose",
        )
        await bus.publish("acme", done, msg_id=f"done-{request_id}")
        await bus.publish(
            "acme",
            msgspec.structs.replace(done, purpose="adhoc", request_id=uuid.uuid4()),
            msg_id="adhoc",
        )  # not a diagnosis: ignored

        sub = await bus.js.pull_subscribe(
            f"{bus.cfg.subject_prefix}.acme.capabilities.identified",
            stream=f"{bus.cfg.stream_prefix}_EVENTS",
        )
        events: list[CapabilitiesIdentified] = []

        async def identified() -> bool:
            try:
                for m in await sub.fetch(5, timeout=0.5):
                    events.append(msgspec.json.decode(m.data, type=CapabilitiesIdentified))
            except Exception:  # noqa: BLE001  a fetch timeout: nothing yet
                pass
            return bool(events)

        await eventually(identified, within=60)
        [event] = events
        assert event.request_id == request_id and event.agent_id == agent_id
        async with store.tenant("acme") as session:
            rows = {c.name: c for c in await session.scalars(select(Capability))}
        kept = [rows[n] for n, c in rows.items() if c.status == "identified"]
        assert [c.name for c in kept] == ["valid_tool_arguments"]
        assert event.capability_ids == [kept[0].id]
        planted = kept[0]
        assert planted.statistics["runs_passed"] >= 8 and planted.statistics["delta"] > 0.5
        assert (
            planted.evidence["trajectories"] == 80 and planted.evidence["skipped_malformed"] == 10
        )
        assert len(planted.evidence["failures_covered"]) == 32
        if "ask_for_missing_information" in rows:
            assert rows["ask_for_missing_information"].status == "rejected"


async def test_a_configured_judge_proposes_and_labels(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """The judge path wired through the service, against a fake judge endpoint that proposes
    one capability and labels by whether the transcript shows a tool error."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from shared.config import ModelConfig

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        if "strict evaluator" not in body["messages"][0]["content"]:
            answer = {
                "capabilities": [
                    {
                        "name": "send_valid_arguments_first",
                        "definition": "LACKING if a tool call was rejected for its "
                        "arguments; PRESENT otherwise.",
                    }
                ]
            }
        else:
            # Only the transcript: the instructions around it mention the ERROR marker too.
            transcript = prompt.split("<transcript>", 1)[-1].split("</transcript>", 1)[0]
            label = "LACKING" if "ERROR" in transcript else "PRESENT"
            answer = {"labels": {"send_valid_arguments_first": label}}
        message = {"role": "assistant", "content": json.dumps(answer)}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "judge",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    judge_server = TestServer(app)
    await judge_server.start_server()
    request_id = uuid.uuid4()
    agent_id = await _plant(store, request_id)
    async with running_contrast(
        service_cfg,
        model=ModelConfig(url=f"http://127.0.0.1:{judge_server.port}/v1"),
        judge_model="judge",
        runs=4,
        min_runs=3,
    ) as bus:
        await bus.publish(
            "acme",
            RolloutCompleted(
                request_id=request_id,
                agent_id=agent_id,
                trajectories=90,
                successes=50,
                mean_reward=0.5,
                purpose="diagnose",
            ),
            msg_id=f"judge-{request_id}",
        )

        async def stored() -> bool:
            async with store.tenant("acme") as session:
                return bool(list(await session.scalars(select(Capability))))

        await eventually(stored, within=60)
        async with store.tenant("acme") as session:
            rows = {c.name: c for c in await session.scalars(select(Capability))}
        # The judge's capability covers the same failures as its rule-based twin: they merge into
        # one kept capability, whichever ranks first.
        [survivor] = [c for c in rows.values() if c.status == "identified"]
        assert {survivor.name, *survivor.evidence["merged"]} == {
            "send_valid_arguments_first",
            "valid_tool_arguments",
        }
        assert survivor.statistics["runs"] == 4
        judged = survivor.name == "send_valid_arguments_first"
        assert survivor.evidence["labeller"] == ("judge" if judged else "deterministic")
    await judge_server.close()


async def _plant_prose_only(
    store: Store, request_id: uuid.UUID, *, malformed: bool = False
) -> uuid.UUID:
    """Real toolbox episodes of an agent that only ever answers in prose (the base model's
    behaviour): every task that needs a tool fails, and the agent has no success that used one.
    With `malformed`, on every other task it first writes a tool call whose arguments are not
    JSON."""
    from services.rollout.tasks import import_tasks
    from shared.envs.protocol import Message, ToolCall, ToolCallFunction
    from shared.envs.runner import call_records
    from shared.envs.toolbox import ToolboxEnvironment

    env = ToolboxEnvironment()
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="m", environment="toolbox")
    env_id, task_ids = await import_tasks(store, "acme", env)
    tasks = [t for t in env.tasks() if t.split == "train"][:16]
    async with store.tenant("acme") as session:
        for n, task in enumerate(tasks):
            episode = env.reset(task, 0)
            turns: list[Message] = []
            if malformed and n % 2:
                name = episode.tools[0]["function"]["name"]
                call = ToolCall(id="c1", function=ToolCallFunction(name=name, arguments="{oops"))
                turns.append(Message(role="assistant", tool_calls=[call]))
            turns.append(
                Message(role="assistant", content="Sure, I have taken care of that for you.")
            )
            replies = [m for turn in turns for m in (turn, *episode.step(turn).messages)]
            score = episode.score()
            calls = call_records(episode)
            messages = [
                {"role": "system", "content": episode.system_prompt},
                *[msgspec.to_builtins(m) for m in (*episode.messages, *replies)],
            ]
            session.add(
                Trajectory(
                    agent_id=agent.id,
                    request_id=request_id,
                    task_id=task_ids[task.id],
                    environment_id=env_id,
                    trial=0,
                    messages=messages,
                    reward=score.reward,
                    success=score.success,
                    reward_breakdown={"checks": score.breakdown, "calls": calls, "error": None},
                )
            )
    return agent.id


@pytest.mark.parametrize("min_successes", [5, 0])
async def test_reference_solutions_stand_in_for_missing_successes(
    service_cfg: ServiceConfig, store: Store, min_successes: int
) -> None:
    request_id = uuid.uuid4()
    agent_id = await _plant_prose_only(store, request_id)
    async with running_contrast(service_cfg, min_successes=min_successes) as bus:
        await bus.publish(
            "acme",
            RolloutCompleted(
                request_id=request_id,
                agent_id=agent_id,
                trajectories=16,
                successes=0,
                mean_reward=0.0,
                purpose="diagnose",
            ),
            msg_id=f"prose-{request_id}",
        )

        async def stored() -> bool:
            async with store.tenant("acme") as session:
                return bool(list(await session.scalars(select(Capability))))

        await eventually(stored, within=90)
        async with store.tenant("acme") as session:
            rows = {c.name: c for c in await session.scalars(select(Capability))}
    tools = rows["use_tools_when_needed"]
    if min_successes == 0:
        # Only the agent's own trajectories: nothing succeeded, so nothing can be contrasted.
        assert tools.status == "rejected"
        assert tools.evidence["references"] == 0
        return
    assert tools.status == "identified"
    references = tools.evidence["references"]
    assert 0 < references <= 16 and tools.evidence["failures_covered"]
    assert all(e.startswith("reference:") for e in tools.evidence["succeeded_examples"])
    assert tools.statistics["delta"] > 0.9


async def test_a_cycle_budget_passes_on_only_the_best_capabilities_and_keeps_the_rest_in_reserve(
    service_cfg: ServiceConfig, store: Store
) -> None:
    from shared.store.models import Cycle
    from tests.integration.test_cycle import emitted

    request_id, cycle_id = uuid.uuid4(), uuid.uuid4()
    agent_id = await _plant_prose_only(store, request_id, malformed=True)
    async with store.tenant("acme") as session:
        session.add(
            Cycle(
                id=cycle_id,
                agent_id=agent_id,
                state="diagnosing",
                data={"settings": {"max_capabilities": 1}},
            )
        )
    async with running_contrast(service_cfg) as bus:
        done = RolloutCompleted(
            request_id=request_id,
            agent_id=agent_id,
            trajectories=16,
            successes=0,
            mean_reward=0.0,
            cycle_id=cycle_id,
            purpose="diagnose",
        )
        await bus.publish("acme", done, msg_id=f"budget-{request_id}")
        stream = f"{bus.cfg.stream_prefix}_EVENTS"

        async def announced() -> bool:
            return bool(await emitted(bus, stream, CapabilitiesIdentified))

        await eventually(announced, within=90)
        [event] = await emitted(bus, stream, CapabilitiesIdentified)
        async with store.tenant("acme") as session:
            kept = list(
                await session.scalars(
                    select(Capability)
                    .where(Capability.status == "identified")
                    .order_by(Capability.created_at, Capability.id)
                )
            )
    # More than one capability separates the failures from the references; the cycle's
    # budget lets only the best one go on, and the others stay stored as identified.
    assert len(kept) > 1
    assert len(event.capability_ids) == 1
    assert event.capability_ids[0] in {c.id for c in kept}
    # the others wait in reserve, in case the best one gets no calibrated environment
    assert set(event.reserve_ids) == {c.id for c in kept} - set(event.capability_ids)
