"""Synthesize + rollout on real NATS and Postgres: a capability in, a calibrated synthetic
environment out. The policy is the oracle fake failing half of its samples at random, so
groups are informative and calibration accepts; when it always succeeds, calibration keeps
adjusting and finally reports failure."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import select

from services.rollout.config import RolloutConfig
from services.rollout.service import build as build_rollout
from services.synthesize.config import SynthesizeConfig
from services.synthesize.service import build as build_synthesize
from shared.bus import NatsBus
from shared.config import ModelConfig, ServiceConfig
from shared.envs.synthetic import SyntheticEnvironment, SyntheticSpec, default_spec
from shared.envs.synthetic.defaults import template_spec
from shared.messages import CapabilitiesIdentified
from shared.runtime.service import Service
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Capability, Environment
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually, healthy
from tests.support.fake_chat import FakeJudge, script
from tests.support.oracle_llm import OracleLLM
from tests.support.transactions import database_now, open_transactions
from tests.unit.test_synthetic_template import TIMED_ALARM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NAME, DEFINITION = "report_result_to_user", "After using tools, tell the user the result."


def _fields(cfg: ServiceConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


async def _run(
    cfg: ServiceConfig,
    fail_rate: float,
    store: Store,
    regenerations: int,
    writer: FakeJudge | None = None,
    played: SyntheticSpec | None = None,
    max_turns: int | None = None,
    seeds: list[int | None] | None = None,
) -> list[Environment]:
    """Synthesize + rollout until the capability's environments settle; `writer` (a fake
    chat endpoint) writes the spec when given, and `played` is the spec the oracle plays;
    `seeds` gets the sampling seed of each calibration episode the oracle played."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="oracle", environment="toolbox")
        capability = Capability(
            agent_id=agent.id, name=NAME, definition=DEFINITION, status="identified"
        )
        session.add(capability)
        await session.flush()
        agent_id, capability_id = agent.id, capability.id
    played = played or default_spec(NAME, DEFINITION)
    fake = OracleLLM(SyntheticEnvironment(played), fail_rate=fail_rate)
    server = TestServer(fake.app())
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}/v1"
    writer_server = None
    extra: dict[str, object] = {}
    if writer is not None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", writer.handle)
        writer_server = TestServer(app)
        await writer_server.start_server()
        extra = {
            "model": ModelConfig(url=f"http://127.0.0.1:{writer_server.port}/v1"),
            "writer_model": "writer",
        }
    services: list[Service] = [
        build_rollout(RolloutConfig(**{**_fields(cfg), "model": ModelConfig(url=url)})),  # type: ignore[arg-type]
        build_synthesize(
            SynthesizeConfig(
                calibration_tasks=12,
                calibration_samples=4,  # type: ignore[arg-type]
                max_regenerations=regenerations,
                max_turns=max_turns,
                **{**_fields(cfg), **extra},
            )
        ),
    ]
    runs = [asyncio.create_task(s.run()) for s in services]
    for s in services:
        await eventually(lambda s=s: healthy(s))
    bus = await NatsBus.connect(cfg.nats.url or "", cfg.nats)
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
        return (
            bool(rows)
            and all(r.status in ("ready", "rejected", "failed") for r in rows)
            and any(r.status in ("ready", "failed") for r in rows)
        )

    await eventually(settled, within=180)
    for s in services:
        s.stop()
    await asyncio.gather(*runs)
    await bus.close()
    await server.close()
    if writer_server is not None:
        await writer_server.close()
    if seeds is not None:
        seeds.extend(fake.seeds)
    async with store.tenant("acme") as session:
        return list(
            await session.scalars(
                select(Environment)
                .where(Environment.kind == "synthetic")
                .order_by(Environment.version)
            )
        )


async def test_capability_gets_a_calibrated_environment(
    service_cfg: ServiceConfig, store: Store
) -> None:
    [env] = await _run(service_cfg, 0.5, store, regenerations=2, max_turns=8)
    assert env.status == "ready" and env.version == 1 and env.name == f"synthetic/{NAME}"
    assert env.calibration["max_turns"] == 8  # the turns its calibration rollout asked for
    result = env.calibration["result"]
    assert result["accepted"] and result["groups"] == 12 and result["rollouts"] == 48
    assert 0.2 <= result["success_rate"] <= 0.6 and result["informative"] >= 0.5
    spec = msgspec.convert(env.spec, dict)
    assert spec["capability"]["name"] == NAME
    async with store.tenant("acme") as session:
        capability = await session.scalar(select(Capability))
    assert capability is not None and capability.status == "synthesized"


async def test_trivial_environment_is_adjusted_then_reported(
    service_cfg: ServiceConfig, store: Store
) -> None:
    seeds: list[int | None] = []
    envs = await _run(service_cfg, 0.0, store, regenerations=1, seeds=seeds)  # always succeeds
    assert [e.status for e in envs] == ["rejected", "failed"]
    assert [e.version for e in envs] == [1, 2]
    # calibration samples with seeds, attempt n with seed + n (trial t: + 7919 t), so a
    # verdict is reproducible; unseeded, calibration verdicts differed from run to run
    assert [e.calibration["seed"] for e in envs] == [0, 1]
    assert sorted(seeds) == sorted(
        a + 7919 * t for a in (0, 1) for t in range(4) for _ in range(12)
    )
    first = envs[0].calibration["result"]
    assert first["direction"] == "harder" and first["success_rate"] > 0.6
    assert any(r.startswith("too easy: mean reward") for r in first["reasons"])
    assert not any(r.startswith("too hard") for r in first["reasons"])
    async with store.tenant("acme") as session:
        capability = await session.scalar(select(Capability))
    assert capability is not None and capability.status == "synth_failed"
    assert capability.evidence["synthesis"]["attempts"] == 2
    # the reason a person reads: which capability, how many attempts, what the last one found
    reason = capability.evidence["synthesis"]["reason"]
    assert reason.startswith(f"{NAME}: calibration failed after 2 attempt(s), the last: ")
    assert envs[1].calibration["result"]["reasons"][0] in reason


class WatchedWriter(FakeJudge):
    """A writer model that, as it replies, counts the transactions that began before its
    request came and are still open: one held across its call would be; the short ones
    around it are long closed, however slowly a loaded machine runs them."""

    def __init__(self, store: Store, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store = store
        self.held: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        began = await database_now(self.store)
        response = await super().handle(request)  # after its delay
        self.held.append(await open_transactions(self.store, begun_before=began))
        return response


async def test_a_written_template_is_calibrated_and_a_bad_one_falls_back(
    service_cfg: ServiceConfig, store: Store
) -> None:
    # An alarm template: the oracle finds a task's reference by its opening request, and
    # alarm requests are unique per task (a contact template repeats requests over worlds).
    written = template_spec(NAME, DEFINITION, TIMED_ALARM)
    reply = json.dumps({"template": msgspec.to_builtins(TIMED_ALARM)})
    writer = WatchedWriter(store, script(reply), delay=2.5)  # a writer that takes its time
    [env] = await _run(service_cfg, 0.5, store, regenerations=1, writer=writer, played=written)
    assert writer.requests and len(writer.held) == len(writer.requests) and max(writer.held) == 0
    assert env.status == "ready" and env.spec["scenario"] == "template"
    assert env.spec["template"] == msgspec.to_builtins(TIMED_ALARM)
    async with store.tenant("acme") as session:
        capability = await session.scalar(select(Capability))
    assert capability is not None and capability.evidence["writer"] == {"accepted": NAME}


async def test_a_writer_that_never_gets_it_right_leaves_the_default_spec(
    service_cfg: ServiceConfig, store: Store
) -> None:
    [env] = await _run(
        service_cfg, 0.5, store, regenerations=1, writer=FakeJudge(script("no JSON here"))
    )
    assert env.status == "ready" and env.spec["scenario"] == default_spec(NAME).scenario
    async with store.tenant("acme") as session:
        capability = await session.scalar(select(Capability))
    assert capability is not None
    assert "not valid JSON" in capability.evidence["writer"]["rejected"]
