"""The train service on real NATS and Postgres with a tiny random model (SmolLM2's tokenizer):
a job becomes a registered adapter with its curve, saved in PEFT format, loaded into the
endpoint and announced; a repeated message does not train twice; a bad job is marked failed
with its reason and announced as `train.failed` (nothing to retry, so nothing dead-lettered)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import select

torch = pytest.importorskip("torch", reason="training needs the train extra")

from services.train.config import TrainConfig  # noqa: E402
from services.train.handlers import TrainHandlers  # noqa: E402
from services.train.service import build  # noqa: E402
from shared.bus import NatsBus  # noqa: E402
from shared.cli.work import cancel  # noqa: E402
from shared.config import ModelConfig, ServiceConfig, StorageConfig  # noqa: E402
from shared.envs.synthetic import family_spec  # noqa: E402
from shared.messages import (  # noqa: E402
    AdapterTrained,
    PromptOptimized,
    TrainingFailed,
    TrainRequested,
)
from shared.store import Store  # noqa: E402
from shared.store.agents import create_agent  # noqa: E402
from shared.store.models import Adapter, Capability, Environment, TrainingJob, Work  # noqa: E402
from shared.store.tenants import create_tenant  # noqa: E402
from tests.integration.test_cycle import emitted  # noqa: E402
from tests.integration.test_delivery import dead_letters, eventually, healthy  # noqa: E402
from tests.support.fake_chat import FakeJudge, script  # noqa: E402
from tests.support.tiny_model import save_tiny_model  # noqa: E402
from tests.support.transactions import database_now, open_transactions  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(save_tiny_model(tmp_path_factory.mktemp("tiny-model")))


async def alarm_environment(session: Any, capability_id: uuid.UUID | None = None) -> Environment:
    """The `valid_tool_arguments` synthetic environment over the alarm family, stored ready."""
    env = Environment(
        name="synthetic/valid_tool_arguments",
        version=1,
        kind="synthetic",
        spec=msgspec.to_builtins(family_spec("set_alarm_at_time", "valid_tool_arguments")),
        status="ready",
        capability_id=capability_id,
    )
    session.add(env)
    await session.flush()
    return env


class FakeEndpoint:
    def __init__(self) -> None:
        self.loaded: list[dict[str, Any]] = []

    async def load(self, request: web.Request) -> web.Response:
        self.loaded.append(await request.json())
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/load_lora_adapter", self.load)
        return app


def _fields(cfg: ServiceConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


async def test_a_job_becomes_a_registered_loaded_adapter(
    service_cfg: ServiceConfig,
    store: Store,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model=str(tiny_model), environment="toolbox")
        capability = Capability(
            agent_id=agent.id, name="valid_tool_arguments", definition="", status="synthesized"
        )
        session.add(capability)
        await session.flush()
        env = await alarm_environment(session, capability.id)
        # the config a cycle writes (agent id) must not be mistaken for training settings
        job = TrainingJob(
            environment_id=env.id, capability_id=capability.id, config={"agent_id": str(agent.id)}
        )
        bad = TrainingJob(
            environment_id=env.id, capability_id=capability.id, config={"grpo": {"group_size": 1}}
        )
        session.add_all([job, bad])
        await session.flush()
        job_id, bad_id = job.id, bad.id
    endpoint = FakeEndpoint()
    server = TestServer(endpoint.app())
    await server.start_server()
    cfg = TrainConfig(
        **{
            **_fields(service_cfg),
            "model": ModelConfig(url=f"http://127.0.0.1:{server.port}/v1"),
            "storage": StorageConfig(data_dir=str(tmp_path)),
        },  # type: ignore[arg-type]
        group_size=2,
        rollout_budget=4,
        max_new_tokens=8,
        max_turns=1,
        rank=4,
        alpha=8,
    )
    loop = asyncio.get_running_loop()
    held: list[int] = []
    real_train = TrainHandlers._train

    def watched_train(self: TrainHandlers, *args: Any, **kwargs: Any) -> Any:
        """Training (in its thread), then: is a transaction that began before it still open?
        One held through training would be; the short ones around it are long closed, however
        slowly a loaded machine runs them (an age threshold could not tell them apart)."""

        def ask(query: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(query, loop).result(timeout=60)

        began = ask(database_now(store))
        result = real_train(self, *args, **kwargs)
        held.append(ask(open_transactions(store, begun_before=began)))
        return result

    monkeypatch.setattr(TrainHandlers, "_train", watched_train)
    service = build(cfg)
    run = asyncio.create_task(service.run())

    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    for jid in (job_id, job_id, bad_id):  # the first job twice: at-least-once delivery
        await bus.publish(
            "acme",
            TrainRequested(job_id=jid, environment_id=env.id),
            msg_id=f"train-{uuid.uuid4()}",
        )

    async def finished() -> bool:
        async with store.tenant("acme") as session:
            done = await session.get(TrainingJob, job_id)
            refused = await session.get(TrainingJob, bad_id)
        return (
            done is not None
            and done.status == "done"
            and refused is not None
            and refused.status == "failed"
        )

    await eventually(finished, within=240)
    assert held and max(held) == 0  # the job trained (once, unless a delivery took it over)
    assert await dead_letters(bus) == []
    service.stop()
    await run  # drains the handler in flight: the job row is done before its announcement is sent
    failed = await bus.js.stream_info(
        f"{service_cfg.nats.stream_prefix}_EVENTS",
        subjects_filter=bus.subject("acme", TrainingFailed),
    )
    announced = await bus.js.stream_info(
        f"{service_cfg.nats.stream_prefix}_EVENTS",
        subjects_filter=bus.subject("acme", AdapterTrained),
    )
    await bus.close()
    await server.close()
    async with store.tenant("acme") as session:
        [adapter] = list(await session.scalars(select(Adapter)))  # trained once, not twice
        done = await session.get(TrainingJob, job_id)
        refused = await session.get(TrainingJob, bad_id)
    assert done is not None and done.adapter_id == adapter.id and done.attempts >= 1
    assert adapter.status == "loaded" and adapter.base_model == str(tiny_model)
    assert [c["step"] for c in adapter.training_curve] == [1, 2]
    assert adapter.training_curve[-1]["rollouts"] == 4
    # the held-out check ran on the environment's test tasks, both models on the same pairs
    assert adapter.heldout["episodes"] == adapter.heldout["tasks"] * 2 == 16
    assert {"base_mean", "adapter_mean", "gain", "ci95", "p", "better"} <= set(adapter.heldout)
    saved = Path(adapter.artifact_uri)
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == 4
    assert (saved / "adapter_model.safetensors").exists()
    assert endpoint.loaded == [{"lora_name": adapter.name, "lora_path": str(saved)}]
    # in the tenant's namespace on the endpoint every tenant shares (issue 14)
    assert adapter.name.startswith("acme/"), adapter.name
    assert refused is not None and "group_size" in (refused.error or "")
    assert sum((failed.state.subjects or {}).values()) == 1
    assert sum((announced.state.subjects or {}).values()) == 1  # announced once


async def test_a_job_sampled_by_the_endpoint_leaves_only_its_adapter_loaded(
    service_cfg: ServiceConfig, store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    """`RETRACE_TRAIN_GENERATION=endpoint` against a real `retrace serve-model`: the endpoint
    samples every rollout from the adapter it is sent after each step; when the job is done
    only the registered adapter is loaded there, and the per-step copies are gone."""
    from shared.serving.server import ServeConfig, load

    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model=str(tiny_model), environment="toolbox")
        env = await alarm_environment(session)
        job = TrainingJob(environment_id=env.id, config={"agent_id": str(agent.id)})
        session.add(job)
        await session.flush()
        job_id, env_id = job.id, env.id
    model_server, engine = load(ServeConfig(model=str(tiny_model), max_batch=8))
    engine.start()
    server = TestServer(model_server.app())
    await server.start_server()
    cfg = TrainConfig(
        **{
            **_fields(service_cfg),
            "model": ModelConfig(url=f"http://127.0.0.1:{server.port}/v1"),
            "storage": StorageConfig(data_dir=str(tmp_path)),
        },  # type: ignore[arg-type]
        generation="endpoint",
        group_size=2,
        rollout_budget=6,
        max_new_tokens=8,
        max_turns=1,
        rank=4,
        alpha=8,
    )
    service = build(cfg)
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.publish(
        "acme", TrainRequested(job_id=job_id, environment_id=env_id), msg_id=f"t-{job_id}"
    )

    async def done() -> bool:
        async with store.tenant("acme") as session:
            row = await session.get(TrainingJob, job_id)
        return row is not None and row.status in ("done", "failed")

    await eventually(done, within=240)
    service.stop()
    await run
    await bus.close()
    await server.close()
    engine.stop()
    async with store.tenant("acme") as session:
        row = await session.get(TrainingJob, job_id)
        [adapter] = list(await session.scalars(select(Adapter)))
    assert row is not None and row.status == "done", row.error if row else None
    assert [c["step"] for c in adapter.training_curve] == [1, 2, 3]
    assert engine.stats.generated_tokens >= 6  # every rollout was sampled by the endpoint
    assert adapter.status == "loaded" and list(engine.adapters) == [adapter.name]
    assert not (tmp_path / "artifacts" / "acme" / "live" / str(job_id)).exists()


async def test_a_job_stopped_mid_training_resumes_on_another_worker(
    service_cfg: ServiceConfig, store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    """Worker A is stopped (SIGTERM) after a few steps: its step ends checkpointed and the
    job goes back to the queue. Worker B (a new process's worth of state) takes the same
    message, resumes from the checkpoint, and finishes: one adapter, steps 1..N once each."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model=str(tiny_model), environment="toolbox")
        capability = Capability(agent_id=agent.id, name="valid_tool_arguments", definition="")
        session.add(capability)
        await session.flush()
        env = await alarm_environment(session, capability.id)
        job = TrainingJob(environment_id=env.id, capability_id=capability.id)
        session.add(job)
        await session.flush()
        job_id, env_id = job.id, env.id
    steps = 30
    fields = {
        **_fields(service_cfg),
        "storage": StorageConfig(data_dir=str(tmp_path)),
        "consumer": msgspec.structs.replace(service_cfg.consumer, shutdown_grace=0.5),
    }
    cfg = TrainConfig(
        **fields,  # type: ignore[arg-type]
        group_size=2,
        rollout_budget=2 * steps,
        max_new_tokens=8,
        max_turns=1,
        rank=4,
        alpha=8,
        load_into_endpoint=False,
    )

    async def progress() -> int:
        async with store.tenant("acme") as session:
            row = await session.get(TrainingJob, job_id)
        return int(((row.config if row else {}).get("progress") or {}).get("step", 0))

    first = build(cfg)
    run = asyncio.create_task(first.run())

    await eventually(lambda: healthy(first))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.publish(
        "acme", TrainRequested(job_id=job_id, environment_id=env_id), msg_id=f"t-{job_id}"
    )

    async def started() -> bool:
        return await progress() >= 3

    await eventually(started, within=120)
    first.stop()  # SIGTERM: the handler is cancelled, the job is handed back
    await run
    stopped_at = await progress()
    assert 3 <= stopped_at < steps, stopped_at
    await asyncio.sleep(1.0)  # the cancelled step ends (and checkpoints) in its thread
    second = build(cfg)
    run = asyncio.create_task(second.run())

    async def done() -> bool:
        async with store.tenant("acme") as session:
            row = await session.get(TrainingJob, job_id)
        return row is not None and row.status == "done"

    await eventually(done, within=180)
    second.stop()
    await run
    await bus.close()
    async with store.tenant("acme") as session:
        [adapter] = list(await session.scalars(select(Adapter)))
        row = await session.get(TrainingJob, job_id)
    assert row is not None and row.attempts == 2
    # B started from A's last checkpoint, not from scratch
    [resumed] = row.config["resumed_from"]
    assert stopped_at <= resumed < steps, (stopped_at, resumed)
    assert [c["step"] for c in adapter.training_curve] == list(range(1, steps + 1))
    assert adapter.training_curve[-1]["rollouts"] == 2 * steps


async def test_a_cancelled_job_stops_at_its_next_step_and_its_cycle_hears_it(
    service_cfg: ServiceConfig, store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    """`retrace cancel JOB` while it trains: the job stops at its next step (its checkpoint
    whole), ends `cancelled` with `train.failed` saying so (its cycle goes on without it),
    and the message is not retried or dead-lettered; a job cancelled before any worker
    took it ends the same way without training."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model=str(tiny_model), environment="toolbox")
        capability = Capability(agent_id=agent.id, name="valid_tool_arguments", definition="")
        session.add(capability)
        await session.flush()
        env = await alarm_environment(session, capability.id)
        running_job = TrainingJob(environment_id=env.id, capability_id=capability.id)
        pending_job = TrainingJob(environment_id=env.id, capability_id=capability.id)
        session.add_all([running_job, pending_job])
        await session.flush()
        job_id, pending_id, env_id = running_job.id, pending_job.id, env.id
    steps = 30
    cfg = TrainConfig(
        **{**_fields(service_cfg), "storage": StorageConfig(data_dir=str(tmp_path))},  # type: ignore[arg-type]
        group_size=2,
        rollout_budget=2 * steps,
        max_new_tokens=8,
        max_turns=1,
        rank=4,
        alpha=8,
        load_into_endpoint=False,
        cancel_poll_s=0.2,
    )
    service = build(cfg)
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)

    async def job(which: uuid.UUID) -> TrainingJob:
        async with store.tenant("acme") as session:
            row = await session.get(TrainingJob, which)
        assert row is not None
        return row

    async def work(which: uuid.UUID) -> Work | None:
        async with store.tenant("acme") as session:
            return await session.get(Work, which)

    try:
        await bus.publish(
            "acme", TrainRequested(job_id=job_id, environment_id=env_id), msg_id=f"t-{job_id}"
        )

        async def training() -> bool:
            row = await work(job_id)
            return row is not None and row.done >= 2

        await eventually(training, within=120)
        progress = await work(job_id)
        assert progress is not None and (progress.kind, progress.total) == ("training", steps)
        assert progress.unit == "steps"
        async with store.tenant("acme") as session:
            await cancel(session, job_id)  # running: flagged
            await cancel(session, pending_id)  # not taken yet: flagged before it starts

        async def ended() -> bool:
            return (await job(job_id)).status == "cancelled"

        await eventually(ended, within=60)
        stopped = await work(job_id)
        assert stopped is not None and stopped.state == "cancelled" and stopped.done < steps
        await bus.publish(
            "acme",
            TrainRequested(job_id=pending_id, environment_id=env_id),
            msg_id=f"t-{pending_id}",
        )

        async def pending_ended() -> bool:
            return (await job(pending_id)).status == "cancelled"

        await eventually(pending_ended, within=60)
        assert "step" not in ((await job(pending_id)).config.get("progress") or {})
        failed: list[Any] = []

        async def both_failed() -> bool:  # each job's row is written before its event goes
            failed[:] = await emitted(
                bus, f"{service_cfg.nats.stream_prefix}_EVENTS", TrainingFailed
            )
            return sorted(str(m.job_id) for m in failed) == sorted([str(job_id), str(pending_id)])

        await eventually(both_failed, within=10)
        assert all("cancel" in m.reason for m in failed)
        assert await dead_letters(bus) == []
        async with store.tenant("acme") as session:
            assert list(await session.scalars(select(Adapter))) == []
    finally:
        service.stop()
        await run
        await bus.close()


async def test_a_prompt_optimisation_job_writes_its_prompt_and_announces_it(
    service_cfg: ServiceConfig, store: Store, tmp_path: Path
) -> None:
    """The GEPA baseline as a job: episodes on the target through the endpoint (a fake that
    always answers in words), within the budget; the result lands in the job."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(
            session, "bot", model="agent", environment="toolbox", system_prompt="Be helpful."
        )
        target = Environment(name="toolbox", version=1, kind="target", status="ready")
        session.add(target)
        await session.flush()
        job = TrainingJob(
            environment_id=target.id,
            config={"agent_id": str(agent.id), "kind": "gepa", "rollout_budget": 8},
        )
        session.add(job)
        await session.flush()
        job_id, target_id = job.id, target.id
    fake = FakeJudge(script("I cannot help with that."))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    server = TestServer(app)
    await server.start_server()
    fields = {
        **_fields(service_cfg),
        "model": ModelConfig(url=f"http://127.0.0.1:{server.port}/v1"),
        "storage": StorageConfig(data_dir=str(tmp_path)),
    }
    service = build(TrainConfig(**fields))  # type: ignore[arg-type]
    run = asyncio.create_task(service.run())

    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.publish(
        "acme", TrainRequested(job_id=job_id, environment_id=target_id), msg_id=f"g-{job_id}"
    )

    async def done() -> bool:
        async with store.tenant("acme") as session:
            row = await session.get(TrainingJob, job_id)
        return row is not None and row.status == "done"

    await eventually(done, within=60)
    service.stop()
    await run  # the row is done before the announcement is sent: read the stream after the drain
    announced = await bus.js.stream_info(
        f"{service_cfg.nats.stream_prefix}_EVENTS",
        subjects_filter=bus.subject("acme", PromptOptimized),
    )
    await bus.close()
    await server.close()
    async with store.tenant("acme") as session:
        row = await session.get(TrainingJob, job_id)
    assert row is not None
    result = row.config["result"]
    # 8 rollouts score the seed on the 6 Pareto tasks but buy no iteration (2 x 3 + 6 > 8)
    assert result["prompt"] == "Be helpful." and result["iterations"] == 0
    assert row.config["progress"]["rollouts"] == 6 == len(fake.requests)
    assert "Be helpful." in fake.requests[0]["messages"][0]["content"]
    assert sum((announced.state.subjects or {}).values()) == 1
