"""The cycle state machine in the evaluator service, on real NATS and Postgres. The test plays
the other services: it publishes the events they would (capabilities identified, an
environment ready and one failed, an adapter trained, evaluation rollouts completed, with
their rows) and checks each transition, what the evaluator asks of the others, that repeated
events change nothing, the promotion, and that a second cycle for a busy agent is refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import msgspec
import pytest
from sqlalchemy import select

from services.evaluator.config import EvaluatorConfig
from services.evaluator.handlers import EvaluatorHandlers
from services.evaluator.state import load
from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.envs.registry import get_environment
from shared.envs.selection import pick_tasks
from shared.envs.synthetic import family_spec
from shared.messages import (
    AdapterTrained,
    CapabilitiesIdentified,
    Contract,
    CycleCompleted,
    CycleRequested,
    CycleSettings,
    EnvironmentReady,
    PromptOptimized,
    RolloutCompleted,
    RolloutRequested,
    SynthesisFailed,
    TrainingFailed,
    TrainRequested,
    decode,
)
from shared.routing.modes import Candidate, Decision, RoutingMode
from shared.runtime.service import Service
from shared.store import Store, quotas
from shared.store.agents import create_agent
from shared.store.models import (
    Adapter,
    Agent,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    Task,
    TrainingJob,
    Trajectory,
)
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually, healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SETTINGS = CycleSettings(
    diagnose_tasks=4, eval_tasks=4, eval_trials=2, route_tasks=2, eval_adapters="all"
)


class ByRequest:
    """A routing mode that sends the listed opening requests to the first candidate and the
    rest to the base model."""

    name = "by-request"

    def __init__(self, requests: set[str]) -> None:
        self.requests = requests

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        chosen = candidates[0] if candidates and query in self.requests else None
        return Decision(chosen, 1.0, self.name)


class FirstAdapter:
    """A routing mode that sends every task to the first candidate."""

    name = "first"

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        return Decision(candidates[0] if candidates else None, 1.0, self.name)


async def emitted(bus: NatsBus, stream: str, contract: type[Contract]) -> list[Contract]:
    """Every message of `contract` in `stream`, in order."""
    js = bus.js
    subject = bus.subject("acme", contract)
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            raw = await js.get_msg(stream, seq)
        except Exception:  # noqa: BLE001  a deleted sequence
            continue
        if raw.subject == subject:
            out.append(decode(raw.data, contract))
    return out


async def published(
    bus: NatsBus,
    stream: str,
    contract: type[Contract],
    count: int,
    where: Callable[[Contract], bool] = lambda _: True,
    within: float = 10.0,
) -> list[Contract]:
    """The messages of `contract` in `stream` that `where` keeps, once there are `count` of
    them: the evaluator commits a cycle's state first and publishes what it sends after, so
    a test that saw the state may read the stream a moment too soon (two did, on slow
    machines)."""
    deadline = time.monotonic() + within
    while len(found := [m for m in await emitted(bus, stream, contract) if where(m)]) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} {contract.__name__}"
        await asyncio.sleep(0.1)
    return found


def _evaluating(message: Contract) -> bool:
    return message.purpose == "evaluate"  # type: ignore[attr-defined,no-any-return]


async def test_a_cycle_runs_through_its_states_and_promotes(
    service_cfg: ServiceConfig, store: Store
) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        agent_id = agent.id
    cfg = EvaluatorConfig(**{f: getattr(service_cfg, f) for f in service_cfg.__struct_fields__})  # type: ignore[arg-type]
    service = Service(
        "evaluator", cfg, EvaluatorHandlers(cfg, FirstAdapter()).table(), default_port=0
    )
    run = asyncio.create_task(service.run())

    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    events = f"{service_cfg.nats.stream_prefix}_EVENTS"
    work = f"{service_cfg.nats.stream_prefix}_WORK"

    async def send(message: Contract) -> None:
        await bus.publish("acme", message, msg_id=f"t-{uuid.uuid4()}")

    async def state(cycle_id: uuid.UUID) -> str | None:
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, cycle_id)
            return row.state if row else None

    async def reaches(cycle_id: uuid.UUID, wanted: str) -> None:
        async def check() -> bool:
            return await state(cycle_id) == wanted

        await eventually(check, within=30)

    cycle_id = uuid.uuid4()
    await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=SETTINGS))
    await reaches(cycle_id, "diagnosing")
    [diagnosis] = await published(bus, events, RolloutRequested, 1)
    assert diagnosis.purpose == "diagnose" and diagnosis.cycle_id == cycle_id  # type: ignore[attr-defined]
    assert len(diagnosis.task_ids) == 4 and diagnosis.split == "train"  # type: ignore[attr-defined]
    # seeded: the same agent and settings diagnose from the same episodes (unseeded, three
    # demos on one machine diagnosed three different capabilities)
    assert diagnosis.sampling.seed == SETTINGS.seed  # type: ignore[attr-defined]

    # a second cycle while this one runs is refused, and says why
    busy = uuid.uuid4()
    await send(CycleRequested(cycle_id=busy, agent_id=agent_id, settings=SETTINGS))
    await reaches(busy, "failed")
    async with store.tenant("acme") as session:
        refused = await session.get(Cycle, busy)
        assert refused is not None and "already has an active cycle" in (refused.error or "")

    # contrast found two capabilities
    async with store.tenant("acme") as session:
        caps = [
            Capability(
                agent_id=agent_id, cycle_id=cycle_id, name=n, definition=n, status="identified"
            )
            for n in ("set_alarms", "ask_first")
        ]
        session.add_all(caps)
        await session.flush()
        cap_ids = [cap.id for cap in caps]
    identified = CapabilitiesIdentified(
        agent_id=agent_id, capability_ids=cap_ids, cycle_id=cycle_id
    )
    await send(identified)
    await reaches(cycle_id, "synthesizing")
    await send(identified)  # a repeat changes nothing

    # one environment ready, the other failed; the target's row exists (the diagnosis
    # rollout imported its tasks), so the GRPO-on-target baseline is trained too
    async with store.tenant("acme") as session:
        target = Environment(name="toolbox", version=1, kind="target", status="ready")
        session.add(target)
        await session.flush()
        target_id = target.id
        env = Environment(
            name="synthetic/set_alarms",
            version=1,
            kind="synthetic",
            status="ready",
            spec=msgspec.to_builtins(family_spec("set_alarm_at_time", "set_alarms")),
            capability_id=cap_ids[0],
        )
        session.add(env)
        await session.flush()
        env_id = env.id
    await send(EnvironmentReady(environment_id=env_id, capability_id=cap_ids[0], cycle_id=cycle_id))
    await asyncio.sleep(0.5)
    assert await state(cycle_id) == "synthesizing"  # waiting for the other capability
    await send(SynthesisFailed(capability_id=cap_ids[1], reason="too hard", cycle_id=cycle_id))
    await reaches(cycle_id, "training")
    async with store.tenant("acme") as session:
        all_jobs = list(await session.scalars(select(TrainingJob)))
    trains = await published(bus, work, TrainRequested, len(all_jobs))
    assert {t.job_id for t in trains} == {j.id for j in all_jobs}  # type: ignore[attr-defined]
    [job] = [j for j in all_jobs if j.environment_id == env_id]
    [baseline_job] = [
        j for j in all_jobs if j.environment_id == target_id and "kind" not in j.config
    ]
    [gepa_job] = [j for j in all_jobs if j.config.get("kind") == "gepa"]
    assert baseline_job.capability_id is None and gepa_job.environment_id == target_id
    # one capability adapter: each baseline spends one adapter's budget (equal budgets)
    assert baseline_job.config["budget_multiplier"] == gepa_job.config["budget_multiplier"] == 1

    # the adapter and the baseline are trained
    async with store.tenant("acme") as session:
        baseline = Adapter(
            agent_id=agent_id,
            cycle_id=cycle_id,
            name="bot--toolbox--v1",
            base_model="smollm2",
            status="loaded",
            training_curve=[{"step": 1, "rollouts": 32, "mean_reward": 0.1}],
        )
        session.add(baseline)
        await session.flush()
        baseline_id = baseline.id
        adapter = Adapter(
            agent_id=agent_id,
            capability_id=cap_ids[0],
            cycle_id=cycle_id,
            name="bot--set_alarms--v1",
            base_model="smollm2",
            status="loaded",
            training_curve=[{"step": 1, "rollouts": 32, "mean_reward": 0.2}],
        )
        session.add(adapter)
        await session.flush()
        adapter_id = adapter.id
    await send(AdapterTrained(adapter_id=adapter_id, job_id=job.id, cycle_id=cycle_id))
    await asyncio.sleep(0.5)
    assert await state(cycle_id) == "training"  # waiting for the baseline
    await send(AdapterTrained(adapter_id=baseline_id, job_id=baseline_job.id, cycle_id=cycle_id))
    await asyncio.sleep(0.5)
    assert await state(cycle_id) == "training"  # waiting for the prompt optimisation
    async with store.tenant("acme") as session:
        row = await session.get(TrainingJob, gepa_job.id)
        assert row is not None
        row.status = "done"
        row.config = {
            **row.config,
            "result": {"prompt": "Be polite and use the tools."},
            "progress": {"rollouts": 30},
            "wall_s": 80.25,
        }
        for trained, seconds in ((job.id, 120.5), (baseline_job.id, 100.0)):
            done = await session.get(TrainingJob, trained)
            assert done is not None
            done.config = {**done.config, "wall_s": seconds}
    await send(PromptOptimized(job_id=gepa_job.id, cycle_id=cycle_id))
    await reaches(cycle_id, "evaluating")
    # the learned router's data (2) and the four configurations on the test split
    requested = await published(bus, events, RolloutRequested, 6, _evaluating)
    evals = [m for m in requested if m.split == "test"]  # type: ignore[attr-defined]
    route = [m for m in requested if m.split == "train"]  # type: ignore[attr-defined]
    # the learned router's data: base and the new adapter on 2 train tasks, one trial each
    assert sorted(str(m.adapter) for m in route) == ["None", "bot--set_alarms--v1"]  # type: ignore[attr-defined]
    assert all(len(m.task_ids) == 2 and m.trials == 1 for m in route)  # type: ignore[attr-defined]
    assert sorted(str(m.adapter) for m in evals) == [  # type: ignore[attr-defined]
        "None",
        "None",
        "bot--set_alarms--v1",
        "bot--toolbox--v1",
    ]
    prompts = [m.system_prompt for m in evals if m.system_prompt]  # type: ignore[attr-defined]
    assert prompts == ["Be polite and use the tools."]  # the GEPA baseline's prompt
    assert len({tuple(m.task_ids) for m in evals}) == 1  # type: ignore[attr-defined]
    assert {m.sampling.seed for m in evals} == {SETTINGS.seed}  # type: ignore[attr-defined]

    # the rollouts ran: the base model fails every test task, the adapter solves every one,
    # the baseline half of them
    toolbox = get_environment("toolbox")
    tests = pick_tasks([t for t in toolbox.tasks() if t.split == "test"], 4)
    async with store.tenant("acme") as session:
        rows = {}
        for t in tests:
            row = Task(environment_id=target_id, external_id=t.id, split="test", kind=t.kind)
            session.add(row)
            await session.flush()
            rows[t.id] = row.id
        for m in evals:
            for i, t in enumerate(tests):
                good = (
                    m.adapter == "bot--set_alarms--v1"  # type: ignore[attr-defined]
                    or (m.adapter == "bot--toolbox--v1" and i % 2 == 0)  # type: ignore[attr-defined]
                    or (m.system_prompt is not None and i == 0)  # type: ignore[attr-defined]
                )
                for trial in range(2):
                    session.add(
                        Trajectory(
                            agent_id=agent_id,
                            request_id=m.request_id,
                            cycle_id=cycle_id,  # type: ignore[attr-defined]
                            task_id=rows[t.id],
                            trial=trial,
                            reward=1.0 if good else 0.0,
                            success=good,
                            messages=[{"role": "user", "content": t.data["request"]}],
                        )
                    )
        # on the train tasks the adapter wins the first and ties the second
        trains = {t.id: t for t in toolbox.tasks() if t.id in route[0].task_ids}  # type: ignore[attr-defined]
        for t in trains.values():
            row = Task(environment_id=target_id, external_id=t.id, split="train", kind=t.kind)
            session.add(row)
            await session.flush()
            rows[t.id] = row.id
        for m in route:
            for i, task_id in enumerate(m.task_ids):  # type: ignore[attr-defined]
                good = i == 1 or m.adapter is not None  # type: ignore[attr-defined]
                session.add(
                    Trajectory(
                        agent_id=agent_id,
                        request_id=m.request_id,  # type: ignore[attr-defined]
                        cycle_id=cycle_id,
                        task_id=rows[task_id],
                        trial=0,
                        reward=1.0 if good else 0.0,
                        success=good,
                        messages=[{"role": "user", "content": trains[task_id].data["request"]}],
                    )
                )
    for m in requested:
        await send(
            RolloutCompleted(
                request_id=m.request_id,
                agent_id=agent_id,
                trajectories=8,  # type: ignore[attr-defined]
                successes=0,
                mean_reward=0.0,
                cycle_id=cycle_id,
                purpose="evaluate",
            )
        )
    await reaches(cycle_id, "completed")
    ended = {m.cycle_id: m for m in await published(bus, events, CycleCompleted, 2)}  # type: ignore[attr-defined]
    assert ended[cycle_id].outcome == "promoted", ended  # type: ignore[attr-defined]
    assert ended[busy].outcome == "failed"  # type: ignore[attr-defined]  # the refused one
    async with store.tenant("acme") as session:
        finished = await session.get(Cycle, cycle_id)
        agent_row = await session.get(Agent, agent_id)
        configs = {e.configuration for e in await session.scalars(select(Evaluation))}
    assert finished is not None and agent_row is not None
    assert agent_row.production_adapters == [str(adapter_id)]  # not the baseline
    report = finished.data["report"]
    assert report["configs"]["routed"]["pass_rate"] == 1.0
    assert report["configs"]["base"]["pass_rate"] == 0.0
    assert report["comparison"]["only_candidate"] == 8 and report["verdict"]["promote"]
    assert configs == {
        "base",
        "adapter:bot--set_alarms--v1",
        "baseline:grpo_target",
        "baseline:gepa",
        "routed",
    }
    assert report["configs"]["baseline:gepa"]["pass_rate"] == 0.25
    assert report["rollouts_spent"] == {
        "base": 0,
        "adapter:bot--set_alarms--v1": 32,
        "baseline:grpo_target": 32,
        "baseline:gepa": 30,
        "routed": 32,
    }
    assert report["training_wall_s"] == {
        "base": 0.0,
        "adapter:bot--set_alarms--v1": 120.5,
        "baseline:grpo_target": 100.0,
        "baseline:gepa": 80.25,
        "routed": 120.5,
    }
    assert report["configs"]["baseline:grpo_target"]["pass_rate"] == 0.5
    versus = report["baselines"]["baseline:grpo_target"]
    assert versus["only_candidate"] == 4 and versus["only_incumbent"] == 0
    assert "baseline" not in str(report["oracle"])  # the ceiling is over base and adapters
    assert "beats base" in finished.reason
    first, second = route[0].task_ids  # type: ignore[attr-defined]
    learned = {e["text"]: e["adapter"] for e in report["router_examples"]}
    assert learned == {
        trains[first].data["request"]: "bot--set_alarms--v1",
        trains[second].data["request"]: None,
    }
    assert agent_row.config["router"]["examples"] == report["router_examples"]
    service.stop()
    await run
    await bus.close()


async def test_a_cycle_whose_training_fails_measures_the_agent_as_is_and_says_why(
    service_cfg: ServiceConfig, store: Store
) -> None:
    agent_id, [cap_id], env_id = await _agent_with_capabilities(
        store, ("set_alarms",), ready="set_alarms"
    )
    cfg = EvaluatorConfig(**{f: getattr(service_cfg, f) for f in service_cfg.__struct_fields__})  # type: ignore[arg-type]
    service = Service(
        "evaluator", cfg, EvaluatorHandlers(cfg, FirstAdapter()).table(), default_port=0
    )
    run = asyncio.create_task(service.run())

    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    cycle_id = uuid.uuid4()

    async def state() -> str | None:
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, cycle_id)
            return row.state if row else None

    async def send(message: Contract) -> None:
        await bus.publish("acme", message, msg_id=f"t-{uuid.uuid4()}")

    for message, wanted in (
        (CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=SETTINGS), "diagnosing"),
        (
            CapabilitiesIdentified(agent_id=agent_id, capability_ids=[cap_id], cycle_id=cycle_id),
            "synthesizing",
        ),
        (
            EnvironmentReady(environment_id=env_id, capability_id=cap_id, cycle_id=cycle_id),
            "training",
        ),
    ):
        await send(message)

        async def reached(wanted: str = wanted) -> bool:
            return await state() == wanted

        await eventually(reached, within=30)
    async with store.tenant("acme") as session:
        [job] = list(await session.scalars(select(TrainingJob)))
    await send(TrainingFailed(job_id=job.id, reason="model would not load", cycle_id=cycle_id))

    async def evaluating() -> bool:
        return await state() == "evaluating"

    await eventually(evaluating, within=30)
    events = f"{service_cfg.nats.stream_prefix}_EVENTS"
    requested = await published(bus, events, RolloutRequested, 1, _evaluating)
    # nothing was trained: only the base model is measured, on the test split (no router data)
    [base] = requested
    assert base.adapter is None and base.split == "test"  # type: ignore[attr-defined]
    assert len(base.task_ids) == SETTINGS.eval_tasks and base.trials == SETTINGS.eval_trials  # type: ignore[attr-defined]

    toolbox = get_environment("toolbox")
    async with store.tenant("acme") as session:
        target = Environment(name="toolbox", version=1, kind="target", status="ready")
        session.add(target)
        await session.flush()
        for i, task_id in enumerate(base.task_ids):  # type: ignore[attr-defined]
            task = next(t for t in toolbox.tasks() if t.id == task_id)
            row = Task(environment_id=target.id, external_id=task_id, split="test", kind=task.kind)
            session.add(row)
            await session.flush()
            for trial in range(SETTINGS.eval_trials):
                session.add(
                    Trajectory(
                        agent_id=agent_id,
                        request_id=base.request_id,  # type: ignore[attr-defined]
                        cycle_id=cycle_id,
                        task_id=row.id,
                        trial=trial,
                        reward=1.0 if i % 2 == 0 else 0.0,
                        success=i % 2 == 0,
                        messages=[{"role": "user", "content": task.data["request"]}],
                    )
                )
    done = RolloutCompleted(
        request_id=base.request_id,  # type: ignore[attr-defined]
        agent_id=agent_id,
        trajectories=SETTINGS.eval_tasks * SETTINGS.eval_trials,  # type: ignore[operator]
        successes=4,
        mean_reward=0.5,
        cycle_id=cycle_id,
        purpose="evaluate",
    )
    await send(done)

    async def completed() -> bool:
        return await state() == "completed"

    await eventually(completed, within=30)
    async with store.tenant("acme") as session:
        row = await session.get(Cycle, cycle_id)
        assert row is not None and row.error is None
        assert row.reason.startswith("nothing to promote: no adapter was trained")
        assert "model would not load" in row.reason
        report = row.data["report"]
        assert report["untrained"] and report["verdict"]["promote"] is False
        assert report["configs"]["base"]["pass_rate"] == 0.5
        evaluated = {e.configuration for e in await session.scalars(select(Evaluation))}
        assert "base" in evaluated
        agent_row = await session.get(Agent, agent_id)
        assert agent_row is not None and not agent_row.production_adapters
    [ended] = await published(bus, events, CycleCompleted, 1)
    assert ended.outcome == "rejected"  # type: ignore[attr-defined]
    service.stop()
    await run
    await bus.close()


@contextlib.asynccontextmanager
async def evaluator_running(
    service_cfg: ServiceConfig, mode: RoutingMode | None = None
) -> AsyncIterator[tuple[NatsBus, Callable[[Contract], Awaitable[None]]]]:
    """The evaluator service (routing with `mode`, default `FirstAdapter`), and a bus with a
    `send` that publishes as another service."""
    cfg = EvaluatorConfig(**{f: getattr(service_cfg, f) for f in service_cfg.__struct_fields__})  # type: ignore[arg-type]
    service = Service(
        "evaluator", cfg, EvaluatorHandlers(cfg, mode or FirstAdapter()).table(), default_port=0
    )
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)

    async def send(message: Contract) -> None:
        await bus.publish("acme", message, msg_id=f"t-{uuid.uuid4()}")

    try:
        yield bus, send
    finally:
        service.stop()
        await run
        await bus.close()


async def test_a_diagnosis_that_keeps_nothing_is_evaluated_as_is_with_its_requests_kept(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """Found by the promotion e2e test: when the diagnosis kept no capability, the cycle moved
    to evaluating but its record of the evaluation requests was never stored, so their
    completion was ignored and the cycle waited a day for its stall timeout."""
    agent_id, _, _ = await _agent_with_capabilities(store, ("set_alarms",), ready="set_alarms")
    cycle_id = uuid.uuid4()
    async with evaluator_running(service_cfg) as (bus, send):

        async def state() -> str | None:
            async with store.tenant("acme") as session:
                row = await session.get(Cycle, cycle_id)
                return row.state if row else None

        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=SETTINGS))
        await eventually(lambda: _is(state, "diagnosing"), within=30)
        await send(CapabilitiesIdentified(agent_id=agent_id, capability_ids=[], cycle_id=cycle_id))
        await eventually(lambda: _is(state, "evaluating"), within=30)
        events = f"{service_cfg.nats.stream_prefix}_EVENTS"
        [base] = await published(bus, events, RolloutRequested, 1, _evaluating)
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, cycle_id)
            assert row is not None
            data = load(row)
        assert data.untrained is not None and "kept no capability" in data.untrained
        assert data.evaluation is not None
        assert data.evaluation.requests == {"base": str(base.request_id)}  # type: ignore[attr-defined]


async def _is(state: Callable[[], Awaitable[str | None]], wanted: str) -> bool:
    return await state() == wanted


async def test_a_capability_without_an_environment_gives_its_place_to_the_next_kept_one(
    service_cfg: ServiceConfig, store: Store
) -> None:
    agent_id, (hard, easy, spare), env_id = await _agent_with_capabilities(
        store, ("hard", "easy", "spare")
    )
    cycle_id = uuid.uuid4()
    one = msgspec.structs.replace(SETTINGS, max_capabilities=1, spare_capabilities=0, baselines=[])

    async def cycle() -> Cycle | None:
        async with store.tenant("acme") as session:
            return await session.get(Cycle, cycle_id)

    async with evaluator_running(service_cfg) as (bus, send):
        events = f"{service_cfg.nats.stream_prefix}_EVENTS"
        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=one))
        await eventually(lambda: _state_is(cycle, "diagnosing"), within=30)
        await send(
            CapabilitiesIdentified(
                agent_id=agent_id,
                capability_ids=[hard],
                cycle_id=cycle_id,
                reserve_ids=[easy, spare],
            )
        )
        await eventually(lambda: _state_is(cycle, "synthesizing"), within=30)
        failed = SynthesisFailed(capability_id=hard, reason="too hard", cycle_id=cycle_id)
        await send(failed)
        await send(failed)  # a redelivery takes no second reserve

        async def asked() -> bool:
            sent = await emitted(bus, events, CapabilitiesIdentified)
            return any(m.capability_ids == [easy] for m in sent)  # type: ignore[attr-defined]

        await eventually(asked, within=30)
        await asyncio.sleep(0.5)
        row = await cycle()
        assert row is not None and row.state == "synthesizing"  # waiting for the stand-in
        synthesis = load(row).synthesis
        assert synthesis is not None
        assert synthesis.capabilities == [str(hard), str(easy)]
        assert synthesis.reserves == [str(spare)]
        assert synthesis.failures() == {str(hard): "too hard"}
        await send(EnvironmentReady(environment_id=env_id, capability_id=easy, cycle_id=cycle_id))
        await eventually(lambda: _state_is(cycle, "training"), within=30)
        async with store.tenant("acme") as session:
            [job] = list(await session.scalars(select(TrainingJob)))
        assert job.capability_id == easy and job.environment_id == env_id


async def test_a_spare_is_synthesized_beside_and_takes_a_failed_capabilitys_place(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """`spare_capabilities` = 1: the first in reserve is synthesized from the start beside the
    chosen capability; when that one fails, the spare (already calibrated) takes its place
    with no synthesis to wait for."""
    agent_id, (hard, easy, spare), env_id = await _agent_with_capabilities(
        store, ("hard", "easy", "spare")
    )
    cycle_id = uuid.uuid4()
    one = msgspec.structs.replace(SETTINGS, max_capabilities=1, baselines=[])
    assert one.spare_capabilities == 1

    async def cycle() -> Cycle | None:
        async with store.tenant("acme") as session:
            return await session.get(Cycle, cycle_id)

    async with evaluator_running(service_cfg) as (bus, send):
        events = f"{service_cfg.nats.stream_prefix}_EVENTS"
        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=one))
        await eventually(lambda: _state_is(cycle, "diagnosing"), within=30)
        identified = CapabilitiesIdentified(
            agent_id=agent_id, capability_ids=[hard], cycle_id=cycle_id, reserve_ids=[easy, spare]
        )
        await send(identified)
        await eventually(lambda: _state_is(cycle, "synthesizing"), within=30)

        async def asked() -> list[list[uuid.UUID]]:
            sent = await emitted(bus, events, CapabilitiesIdentified)
            return [m.capability_ids for m in sent if m.capability_ids != [hard]]  # type: ignore[attr-defined]

        async def spare_asked() -> bool:
            return await asked() == [[easy]]

        await eventually(spare_asked, within=30)
        row = await cycle()
        assert row is not None
        synthesis = load(row).synthesis
        assert synthesis is not None
        assert synthesis.spares == [str(easy)] and synthesis.reserves == [str(spare)]
        # the spare is calibrated first; the cycle still waits for the chosen capability
        await send(EnvironmentReady(environment_id=env_id, capability_id=easy, cycle_id=cycle_id))
        await asyncio.sleep(0.5)
        assert await _state_is(cycle, "synthesizing")
        failed = SynthesisFailed(capability_id=hard, reason="too hard", cycle_id=cycle_id)
        await send(failed)
        await send(failed)
        await eventually(lambda: _state_is(cycle, "training"), within=30)
        async with store.tenant("acme") as session:
            [job] = list(await session.scalars(select(TrainingJob)))
        assert job.capability_id == easy and job.environment_id == env_id
        assert await asked() == [[easy]]  # nothing more was synthesized
        row = await cycle()
        assert row is not None
        synthesis = load(row).synthesis
        assert synthesis is not None and synthesis.capabilities == [str(hard), str(easy)]


async def test_a_cycle_waits_for_its_spare_and_leaves_it_untrained_when_not_needed(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """The chosen capability calibrated first: training waits for the spare's synthesis to
    end (it would compete with training for the machine), then trains the chosen one only."""
    agent_id, (hard, easy), env_id = await _agent_with_capabilities(
        store, ("hard", "easy"), ready="hard"
    )
    cycle_id = uuid.uuid4()
    one = msgspec.structs.replace(SETTINGS, max_capabilities=1, baselines=[])

    async def cycle() -> Cycle | None:
        async with store.tenant("acme") as session:
            return await session.get(Cycle, cycle_id)

    async with evaluator_running(service_cfg) as (_, send):
        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=one))
        await eventually(lambda: _state_is(cycle, "diagnosing"), within=30)
        await send(
            CapabilitiesIdentified(
                agent_id=agent_id, capability_ids=[hard], cycle_id=cycle_id, reserve_ids=[easy]
            )
        )
        await eventually(lambda: _state_is(cycle, "synthesizing"), within=30)
        await send(EnvironmentReady(environment_id=env_id, capability_id=hard, cycle_id=cycle_id))
        await asyncio.sleep(0.5)
        assert await _state_is(cycle, "synthesizing")  # the spare is still calibrating
        await send(SynthesisFailed(capability_id=easy, reason="too hard", cycle_id=cycle_id))
        await eventually(lambda: _state_is(cycle, "training"), within=30)
        async with store.tenant("acme") as session:
            [job] = list(await session.scalars(select(TrainingJob)))
        assert job.capability_id == hard


async def _agent_with_capabilities(
    store: Store, names: Sequence[str], ready: str = "easy"
) -> tuple[uuid.UUID, list[uuid.UUID], uuid.UUID]:
    """A tenant's agent with capabilities of these names, and a ready synthetic environment
    for the one named `ready`."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        caps = [Capability(agent_id=agent.id, name=n, definition=n) for n in names]
        session.add_all(caps)
        await session.flush()
        env = Environment(
            name=f"synthetic/{ready}",
            version=1,
            kind="synthetic",
            status="ready",
            spec=msgspec.to_builtins(family_spec("set_alarm_at_time", ready)),
            capability_id=caps[list(names).index(ready)].id,
        )
        session.add(env)
        await session.flush()
        return agent.id, [c.id for c in caps], env.id


async def _state_is(cycle: Callable[[], Awaitable[Cycle | None]], wanted: str) -> bool:
    row = await cycle()
    return row is not None and row.state == wanted


async def test_synthesis_outcomes_that_arrive_before_the_capabilities_are_applied(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """The synthesize service consumes `capabilities.identified` too, and may settle a
    capability (a quick failure, say) before the evaluator has read that message: the
    outcome is kept and applied when it has, not dropped as a repeat."""
    agent_id, (hard, easy), env_id = await _agent_with_capabilities(store, ("hard", "easy"))
    cycle_id = uuid.uuid4()
    settings = msgspec.structs.replace(SETTINGS, baselines=[])

    async def cycle() -> Cycle | None:
        async with store.tenant("acme") as session:
            return await session.get(Cycle, cycle_id)

    async with evaluator_running(service_cfg) as (_, send):
        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=settings))
        await eventually(lambda: _state_is(cycle, "diagnosing"), within=30)
        await send(SynthesisFailed(capability_id=hard, reason="too hard", cycle_id=cycle_id))
        await send(EnvironmentReady(environment_id=env_id, capability_id=easy, cycle_id=cycle_id))

        async def kept() -> bool:
            row = await cycle()
            diagnosis = load(row).diagnosis if row is not None else None
            return diagnosis is not None and len(diagnosis.early) == 2

        await eventually(kept, within=30)
        await send(
            CapabilitiesIdentified(
                agent_id=agent_id, capability_ids=[hard, easy], cycle_id=cycle_id
            )
        )
        await eventually(lambda: _state_is(cycle, "training"), within=30)
        row = await cycle()
        assert row is not None
        data = load(row)
        assert data.synthesis is not None and data.synthesis.failures() == {str(hard): "too hard"}
        assert data.diagnosis is not None and data.diagnosis.early == {}
        async with store.tenant("acme") as session:
            [job] = list(await session.scalars(select(TrainingJob)))
        assert job.capability_id == easy and job.environment_id == env_id


@pytest.mark.parametrize("routed", [2, 0])
async def test_an_adapter_is_played_only_on_the_test_tasks_routed_to_it(
    service_cfg: ServiceConfig, store: Store, routed: int
) -> None:
    """`eval_adapters` = `routed` (the default): the base model plays the test split first;
    the adapter then plays only the tasks routing sends it, with the same seeds, and the
    routed set is judged on those outcomes. An adapter routed nowhere is not played."""
    agent_id, [cap_id], env_id = await _agent_with_capabilities(store, ("easy",))
    settings = CycleSettings(diagnose_tasks=4, eval_tasks=4, eval_trials=2, baselines=[])
    assert settings.eval_adapters == "routed"
    toolbox = get_environment("toolbox")
    tests = pick_tasks([t for t in toolbox.tasks() if t.split == "test"], 4)
    to_adapter = {t.id for t in tests[:routed]}
    mode = ByRequest({t.data["request"] for t in tests if t.id in to_adapter})
    cycle_id = uuid.uuid4()

    async def cycle() -> Cycle | None:
        async with store.tenant("acme") as session:
            return await session.get(Cycle, cycle_id)

    async with evaluator_running(service_cfg, mode) as (bus, send):
        events = f"{service_cfg.nats.stream_prefix}_EVENTS"

        async def evaluations() -> list[Contract]:
            sent = await emitted(bus, events, RolloutRequested)
            return [m for m in sent if m.purpose == "evaluate"]  # type: ignore[attr-defined]

        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=settings))
        await eventually(lambda: _state_is(cycle, "diagnosing"), within=30)
        await send(
            CapabilitiesIdentified(agent_id=agent_id, capability_ids=[cap_id], cycle_id=cycle_id)
        )
        await eventually(lambda: _state_is(cycle, "synthesizing"), within=30)
        await send(EnvironmentReady(environment_id=env_id, capability_id=cap_id, cycle_id=cycle_id))
        await eventually(lambda: _state_is(cycle, "training"), within=30)
        async with store.tenant("acme") as session:
            [job] = list(await session.scalars(select(TrainingJob)))
            adapter = Adapter(
                agent_id=agent_id,
                capability_id=cap_id,
                cycle_id=cycle_id,
                name="bot--easy--v1",
                base_model="smollm2",
                status="loaded",
                training_curve=[{"step": 1, "rollouts": 32, "mean_reward": 0.2}],
            )
            session.add(adapter)
            await session.flush()
            adapter_id = adapter.id
        await send(AdapterTrained(adapter_id=adapter_id, job_id=job.id, cycle_id=cycle_id))
        await eventually(lambda: _state_is(cycle, "evaluating"), within=30)
        [base] = await evaluations()  # the adapter waits for routing
        assert base.adapter is None and sorted(base.task_ids) == sorted(t.id for t in tests)  # type: ignore[attr-defined]

        async with store.tenant("acme") as session:
            target = Environment(name="toolbox", version=1, kind="target", status="ready")
            session.add(target)
            await session.flush()
            rows = {}
            for t in tests:
                row = Task(environment_id=target.id, external_id=t.id, split="test", kind=t.kind)
                session.add(row)
                await session.flush()
                rows[t.id] = row.id

        async def played(request: Contract, task_ids: Sequence[str], good: bool) -> None:
            async with store.tenant("acme") as session:
                for task_id in task_ids:
                    opening = next(t for t in tests if t.id == task_id).data["request"]
                    for trial in range(settings.eval_trials):
                        session.add(
                            Trajectory(
                                agent_id=agent_id,
                                request_id=request.request_id,  # type: ignore[attr-defined]
                                cycle_id=cycle_id,
                                task_id=rows[task_id],
                                trial=trial,
                                reward=1.0 if good else 0.0,
                                success=good,
                                messages=[{"role": "user", "content": opening}],
                            )
                        )
            done = RolloutCompleted(
                request_id=request.request_id,  # type: ignore[attr-defined]
                agent_id=agent_id,
                trajectories=len(task_ids) * settings.eval_trials,
                successes=0,
                mean_reward=0.0,
                cycle_id=cycle_id,
                purpose="evaluate",
            )
            await send(done)
            await send(done)  # a redelivery asks for nothing twice

        await played(base, base.task_ids, good=False)  # type: ignore[attr-defined]
        if routed:

            async def adapter_asked() -> bool:
                return len(await evaluations()) == 2

            await eventually(adapter_asked, within=30)
            await asyncio.sleep(0.5)
            [_, second] = await evaluations()  # and no third: the repeat asked nothing
            assert second.adapter == "bot--easy--v1" and second.split == "test"  # type: ignore[attr-defined]
            assert sorted(second.task_ids) == sorted(to_adapter)  # type: ignore[attr-defined]
            assert second.trials == base.trials and second.sampling == base.sampling  # type: ignore[attr-defined]
            await played(second, second.task_ids, good=True)  # type: ignore[attr-defined]
        await eventually(lambda: _state_is(cycle, "completed"), within=30)
        assert len(await evaluations()) == (2 if routed else 1)
        row = await cycle()
        assert row is not None
        report = row.data["report"]
        assert report["played_on"] == {"adapter:bot--easy--v1": routed}
        assert report["oracle"] is None  # not measured: the adapter skipped tasks
        assert report["configs"]["adapter:bot--easy--v1"]["episodes"] == routed * 2
        assert report["configs"]["routed"]["episodes"] == 8
        assert report["configs"]["routed"]["pass_rate"] == routed / 4
        assert report["comparison"]["only_candidate"] == routed * 2


async def test_a_cycle_over_the_tenants_quota_is_refused_by_the_evaluator(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """Whoever asks (the API checks first, but the failure-rate monitor or two requests at
    once get past it), the evaluator does not start a cycle beyond the tenant's quota: it
    records the cycle as failed, saying which quota. A cycle the control API recorded as
    requested is taken (its row moves on) and does not count against the quota itself."""
    first_agent, _, _ = await _agent_with_capabilities(store, ("set_alarms",), ready="set_alarms")
    async with store.cross_tenant() as session:
        await quotas.set_quotas(session, "acme", quotas.Quotas(max_active_cycles=1))
    async with store.tenant("acme") as session:
        other = await create_agent(session, "other", model="smollm2", environment="toolbox")
        other_id = other.id
    running, refused = uuid.uuid4(), uuid.uuid4()
    async with store.tenant("acme") as session:  # as the control API records it
        session.add(Cycle(id=running, agent_id=first_agent, state="requested"))
    async with evaluator_running(service_cfg) as (_, send):

        async def state(cycle_id: uuid.UUID) -> str | None:
            async with store.tenant("acme") as session:
                row = await session.get(Cycle, cycle_id)
                return row.state if row else None

        await send(CycleRequested(cycle_id=running, agent_id=first_agent, settings=SETTINGS))
        await eventually(lambda: _is(lambda: state(running), "diagnosing"), within=30)
        await send(CycleRequested(cycle_id=refused, agent_id=other_id, settings=SETTINGS))
        await eventually(lambda: _is(lambda: state(refused), "failed"), within=30)
    async with store.tenant("acme") as session:
        row = await session.get(Cycle, refused)
        assert row is not None and (row.reason or "").startswith("quota:"), row.reason
        assert "1 cycle at once" in row.reason


async def test_a_cycle_whose_target_cannot_be_opened_fails_saying_so(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """A requested cycle (the control API's row) for an agent whose environment no longer
    opens: it was dead-lettered and left `requested`, holding the agent; now it fails with
    the reason."""
    agent_id, _, _ = await _agent_with_capabilities(store, ("set_alarms",), ready="set_alarms")
    cycle_id = uuid.uuid4()
    async with store.tenant("acme") as session:
        agent = await session.get(Agent, agent_id)
        assert agent is not None
        agent.environment = "no-such-environment"
        session.add(Cycle(id=cycle_id, agent_id=agent_id, state="requested"))
    async with evaluator_running(service_cfg) as (_, send):

        async def state() -> str | None:
            async with store.tenant("acme") as session:
                row = await session.get(Cycle, cycle_id)
                return row.state if row else None

        await send(CycleRequested(cycle_id=cycle_id, agent_id=agent_id, settings=SETTINGS))
        await eventually(lambda: _is(state, "failed"), within=30)
    async with store.tenant("acme") as session:
        row = await session.get(Cycle, cycle_id)
        assert row is not None and "the target environment cannot be opened" in row.reason
