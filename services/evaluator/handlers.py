"""Handlers of the evaluator service: the cycle's orchestrator, one function per event.

Each loads the cycle (locked), checks the state it expects, records what the event brings in
the cycle's typed data (`state.py`) and, when that completes the stage, takes the step the
table in `machine.py` allows (`machine.move`). A repeated or late event finds the cycle in
another state or its outcome already recorded and changes nothing, so any service can crash
and restart without losing or duplicating work. Events may come in any order where two
services consume one message: a capability's synthesis outcome that arrives before
`capabilities.identified` is kept and applied when it does.

The work of each step lives beside it: queueing the training jobs (`jobs.py`), the evaluation
fan-out (`fanout.py`), the routed set's simulation (`routed.py`), the verdict and promotion
(`promotion.py`).
"""

from __future__ import annotations

import uuid

from sqlalchemy import select

from services.evaluator.config import EvaluatorConfig
from services.evaluator.fanout import Configuration, request_evaluations, request_routed
from services.evaluator.jobs import queue_stage
from services.evaluator.promotion import decide, plan_routing
from services.evaluator.state import (
    JOB_FAILED,
    PROMPT,
    CycleData,
    Diagnosis,
    Settlement,
    Synthesis,
    baseline_config,
    load,
    save,
)
from shared import cycle as machine
from shared import embeddings
from shared.bus.delivery import Handler, HandlerContext
from shared.cycle import State
from shared.envs.registry import open_environment
from shared.envs.selection import pick_tasks
from shared.errors import PermanentError
from shared.logging import get_logger
from shared.messages import (
    AdapterTrained,
    CapabilitiesIdentified,
    Contract,
    CycleCompleted,
    CycleRequested,
    EnvironmentReady,
    PromptOptimized,
    RolloutCompleted,
    RolloutRequested,
    Sampling,
    SynthesisFailed,
    TrainingFailed,
)
from shared.routing.modes import BaseOnly, RoutingMode, embedding_routing
from shared.store import quotas
from shared.store.models import Adapter, Agent, Cycle, TrainingJob

log = get_logger(__name__)


class EvaluatorHandlers:
    def __init__(self, cfg: EvaluatorConfig, mode: RoutingMode | None = None) -> None:
        self.cfg = cfg
        if mode is None:
            mode = (
                embedding_routing(cfg.routing_embedder, cfg.min_confidence)
                if embeddings.routable(cfg.routing_embedder)
                else BaseOnly()
            )
        self.mode = mode

    def table(self) -> dict[type[Contract], Handler]:
        return {
            CycleRequested: self.cycle_requested,
            CapabilitiesIdentified: self.capabilities_identified,
            EnvironmentReady: self.environment_ready,
            SynthesisFailed: self.synthesis_failed,
            AdapterTrained: self.adapter_trained,
            TrainingFailed: self.training_failed,
            PromptOptimized: self.prompt_optimized,
            RolloutCompleted: self.rollout_completed,
        }

    # -- start -------------------------------------------------------------------------------

    async def cycle_requested(self, msg: CycleRequested, ctx: HandlerContext) -> None:
        # the control API records its cycles as requested before publishing; any other state
        # is a repeat
        row = await ctx.session.get(Cycle, msg.cycle_id)
        if row is not None and (row.state != State.REQUESTED or row.agent_id != msg.agent_id):
            return
        agent = await ctx.session.get(Agent, msg.agent_id)
        if agent is None:
            # no agent row to hang a cycle on (the foreign key): nothing to record
            log.warning("cycle requested for an unknown agent", agent=str(msg.agent_id))
            return
        on = type(msg).__name__
        # the target first, before any lock (an HTTP environment may take a while to answer);
        # one that cannot be opened at all ends the cycle saying so (one out of reach for now
        # is retried, then dead-lettered, and the stall watch ends a requested row)
        try:
            env = await open_environment(agent.environment)
            tasks = pick_tasks(
                [t for t in env.tasks() if t.split == "train"], msg.settings.diagnose_tasks
            )
        except PermanentError as exc:
            refused: str | None = f"the target environment cannot be opened: {exc}"
        else:
            refused = None
        if row is not None:  # locked now, and read again: a cancel may have come meanwhile
            row = await ctx.session.get(
                Cycle, msg.cycle_id, with_for_update=True, populate_existing=True
            )
            if row is None or row.state != State.REQUESTED:
                return
        if refused is not None:
            _refused(ctx, msg, agent, refused, on, row)
            return
        active = await ctx.session.scalar(
            select(Cycle).where(
                Cycle.agent_id == agent.id,
                Cycle.state.in_(machine.ACTIVE),
                Cycle.id != msg.cycle_id,
            )
        )
        if active is not None:
            why = f"{agent.name} already has an active cycle ({active.id}, {active.state})"
            _refused(ctx, msg, agent, why, on, row)
            return
        try:  # last before the row: the check locks the tenant's row until this commits
            await quotas.check_cycle(ctx.session, ctx.tenant, besides=msg.cycle_id)
        except PermanentError as exc:  # over a quota (or quotas stored wrong by hand)
            _refused(ctx, msg, agent, str(exc), on, row)
            return
        request_id = uuid.uuid4()
        data = CycleData(settings=msg.settings, diagnosis=Diagnosis(request_id=str(request_id)))
        _new_cycle(ctx, msg, agent, State.DIAGNOSING, data, on, row)
        ctx.emit(
            RolloutRequested(
                request_id=request_id,
                agent_id=agent.id,
                environment=agent.environment,
                split="train",
                task_ids=[t.id for t in tasks],
                trials=msg.settings.diagnose_trials,
                # seeded as evaluations are: the diagnosis, which decides what the cycle
                # trains, is the same each time for the same agent and settings (unseeded,
                # three demos of one machine class chose three capabilities to train)
                sampling=Sampling(
                    temperature=msg.settings.temperature,
                    max_tokens=msg.settings.max_tokens,
                    seed=msg.settings.seed,
                ),
                cycle_id=msg.cycle_id,
                purpose="diagnose",
            )
        )
        log.info("cycle started", cycle=str(msg.cycle_id), agent=agent.name)

    # -- diagnosis and synthesis -------------------------------------------------------------

    async def capabilities_identified(
        self, msg: CapabilitiesIdentified, ctx: HandlerContext
    ) -> None:
        cycle = await self._cycle(ctx, msg.cycle_id, State.DIAGNOSING)
        if cycle is None:
            return
        on = type(msg).__name__
        data = load(cycle)
        if not msg.capability_ids:
            await self._untrained(
                ctx,
                cycle,
                data,
                "the diagnosis kept no capability: no behaviour separated the failed "
                "trajectories from the successful ones (see `retrace capabilities`)",
                on,
            )
            return
        early = data.diagnosis.early if data.diagnosis else {}
        if data.diagnosis is not None:
            data.diagnosis.early = {}
        data.synthesis = Synthesis(
            capabilities=[str(i) for i in msg.capability_ids],
            reserves=[str(i) for i in msg.reserve_ids],
        )
        machine.move(cycle, State.SYNTHESIZING, on)
        self._start_spares(ctx, cycle, data)
        # the synthesize service also consumes capabilities.identified and may have settled
        # some before this handler ran: apply them now (their order does not change the outcome)
        for capability, settlement in early.items():
            if cycle.state != State.SYNTHESIZING:
                break
            await self._apply_settlement(ctx, cycle, data, capability, settlement, on)
        save(cycle, data)

    async def environment_ready(self, msg: EnvironmentReady, ctx: HandlerContext) -> None:
        await self._settled(
            ctx,
            msg,
            msg.cycle_id,
            msg.capability_id,
            Settlement(environment=str(msg.environment_id)),
        )

    async def synthesis_failed(self, msg: SynthesisFailed, ctx: HandlerContext) -> None:
        await self._settled(
            ctx, msg, msg.cycle_id, msg.capability_id, Settlement(reason=msg.reason)
        )

    async def _settled(
        self,
        ctx: HandlerContext,
        msg: Contract,
        cycle_id: uuid.UUID | None,
        capability_id: uuid.UUID,
        settlement: Settlement,
    ) -> None:
        if cycle_id is None:
            return
        cycle = await ctx.session.get(Cycle, cycle_id, with_for_update=True)
        if cycle is None or cycle.state not in (State.DIAGNOSING, State.SYNTHESIZING):
            return
        data = load(cycle)
        if cycle.state == State.DIAGNOSING:
            # synthesis settled a capability before `capabilities.identified` reached this
            # service (both consume it): keep it until that message moves the cycle on
            assert data.diagnosis is not None
            data.diagnosis.early.setdefault(str(capability_id), settlement)
            save(cycle, data)
            log.info("a capability settled early; kept", cycle=str(cycle_id))
            return
        await self._apply_settlement(
            ctx, cycle, data, str(capability_id), settlement, type(msg).__name__
        )
        save(cycle, data)

    async def _apply_settlement(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        data: CycleData,
        capability_id: str,
        settlement: Settlement,
        on: str,
    ) -> None:
        """One capability's synthesis outcome; once every capability has one, the jobs."""
        synthesis = data.synthesis
        assert synthesis is not None
        ours = {*synthesis.capabilities, *synthesis.spares}
        if capability_id not in ours or capability_id in synthesis.settled:
            return  # not this cycle's, or settled before: a redelivery
        synthesis.settled[capability_id] = settlement
        if settlement.environment is None and capability_id in synthesis.capabilities:
            # the next-best kept capability takes the failed one's place in the budget: a
            # spare already being synthesized (or done), else the next in reserve
            stand_in = next(iter(synthesis.available_spares()), None)
            if stand_in is None and synthesis.reserves:
                stand_in = synthesis.reserves.pop(0)
                self._ask_synthesis(ctx, cycle, stand_in)
            if stand_in is not None:
                synthesis.capabilities.append(stand_in)
                log.info(
                    "no environment for a capability: the next one in reserve takes its place",
                    cycle=str(cycle.id),
                    failed=capability_id,
                    next=stand_in,
                    spare=stand_in in synthesis.spares,
                )
        self._start_spares(ctx, cycle, data)
        if not synthesis.complete():
            return
        ready = synthesis.ready()
        if not ready:
            why = f"no capability got a calibrated environment: {_listed(synthesis.failures())}"
            await self._untrained(ctx, cycle, data, why, on)
            return
        data.training = await queue_stage(ctx, cycle, data.settings, ready)
        machine.move(cycle, State.TRAINING, on)

    def _start_spares(self, ctx: HandlerContext, cycle: Cycle, data: CycleData) -> None:
        """Synthesize reserves beside the capabilities still pending, up to
        `spare_capabilities` at a time."""
        synthesis = data.synthesis
        assert synthesis is not None
        while (
            synthesis.pending()
            and synthesis.reserves
            and len(synthesis.available_spares()) < data.settings.spare_capabilities
        ):
            spare = synthesis.reserves.pop(0)
            synthesis.spares.append(spare)
            self._ask_synthesis(ctx, cycle, spare)
            log.info("a spare capability is synthesized beside", cycle=str(cycle.id), spare=spare)

    def _ask_synthesis(self, ctx: HandlerContext, cycle: Cycle, capability: str) -> None:
        """Ask the synthesize service for one more capability's environment."""
        ctx.emit(
            CapabilitiesIdentified(
                agent_id=cycle.agent_id,
                capability_ids=[uuid.UUID(capability)],
                cycle_id=cycle.id,
            ),
            key=f"synthesize-{capability}",
        )

    # -- training ----------------------------------------------------------------------------

    async def adapter_trained(self, msg: AdapterTrained, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg, msg.cycle_id, msg.job_id, str(msg.adapter_id))

    async def prompt_optimized(self, msg: PromptOptimized, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg, msg.cycle_id, msg.job_id, PROMPT)

    async def training_failed(self, msg: TrainingFailed, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg, msg.cycle_id, msg.job_id, JOB_FAILED, msg.reason)

    async def _job_settled(
        self,
        ctx: HandlerContext,
        msg: Contract,
        cycle_id: uuid.UUID | None,
        job_id: uuid.UUID,
        outcome: str,
        why: str = "",
    ) -> None:
        cycle = await self._cycle(ctx, cycle_id, State.TRAINING)
        if cycle is None:
            return
        data = load(cycle)
        training = data.training
        if training is None or training.jobs.get(str(job_id), "") is not None:
            return  # not this cycle's job, or settled before: a redelivery
        training.jobs[str(job_id)] = outcome
        if outcome == JOB_FAILED:
            training.failures[str(job_id)] = why
        if training.complete():
            await self._trained(ctx, cycle, data, type(msg).__name__)
        save(cycle, data)

    async def _trained(self, ctx: HandlerContext, cycle: Cycle, data: CycleData, on: str) -> None:
        """Every job settled: evaluate the adapters and the baselines that came out."""
        training = data.training
        assert training is not None
        trained = [
            outcome
            for job, outcome in training.jobs.items()
            if outcome not in (None, JOB_FAILED) and job not in training.baselines
        ]
        baselines: dict[str, Configuration] = {}
        for job, name in training.baselines.items():
            outcome = training.jobs.get(job)
            if outcome in (None, JOB_FAILED):
                continue
            if outcome == PROMPT:
                row = await ctx.session.get(TrainingJob, uuid.UUID(job))
                prompt = ((row.config if row else {}).get("result") or {}).get("prompt")
                if prompt is not None:
                    baselines[baseline_config(name)] = (None, str(prompt))
                continue
            adapter = await ctx.session.get(Adapter, uuid.UUID(str(outcome)))
            if adapter is not None:
                baselines[baseline_config(name)] = (adapter.name, None)
        failures = _listed(training.failures)
        if not trained and not baselines:
            await self._untrained(ctx, cycle, data, f"no adapter was trained: {failures}", on)
            return
        adapters = list(
            await ctx.session.scalars(
                select(Adapter).where(Adapter.id.in_([uuid.UUID(str(a)) for a in trained]))
            )
        )
        if not trained:
            data.untrained = f"no adapter was trained: {failures}"
        await self._evaluate(ctx, cycle, data, adapters, baselines, on)

    # -- evaluation --------------------------------------------------------------------------

    async def _untrained(
        self, ctx: HandlerContext, cycle: Cycle, data: CycleData, why: str, on: str
    ) -> None:
        """Nothing to train or nothing trained: the cycle still measures the agent as it is on
        the test split (the base model and the production adapters), so its report says where
        the agent stands, and completes without promoting anything, saying why."""
        data.untrained = why
        log.warning("cycle has nothing to promote; evaluating as is", cycle=str(cycle.id), why=why)
        await self._evaluate(ctx, cycle, data, [], {}, on)

    async def _evaluate(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        data: CycleData,
        adapters: list[Adapter],
        extra: dict[str, Configuration],
        on: str,
    ) -> None:
        agent = await ctx.session.get(Agent, cycle.agent_id)
        if agent is None:
            self._fail(ctx, cycle, "the agent was deleted", on)
            return
        new = {a.id for a in adapters}
        production = [
            a
            for a in await ctx.session.scalars(
                select(Adapter).where(
                    Adapter.id.in_([uuid.UUID(str(i)) for i in agent.production_adapters or []])
                )
            )
            if a.id not in new
        ]
        target = await open_environment(agent.environment)  # off the loop when not cached
        data.evaluation = request_evaluations(
            ctx, cycle, agent, target, data.settings, adapters, production, extra
        )
        machine.move(cycle, State.EVALUATING, on)
        # stored here, whoever called: a caller that returned without it left the cycle
        # evaluating with no record of its requests, waiting for its stall timeout (a day)
        save(cycle, data)

    async def rollout_completed(self, msg: RolloutCompleted, ctx: HandlerContext) -> None:
        if msg.purpose != "evaluate":
            return
        cycle = await self._cycle(ctx, msg.cycle_id, State.EVALUATING)
        if cycle is None:
            return
        data = load(cycle)
        evaluation = data.evaluation
        request = str(msg.request_id)
        if evaluation is None or request in evaluation.done:
            return
        if request not in {*evaluation.requests.values(), *evaluation.route_requests.values()}:
            return
        evaluation.done.append(request)
        learned = self.cfg.routing_mode == "learned"
        if evaluation.awaiting_routing():
            agent = await ctx.session.get(Agent, cycle.agent_id)
            assert agent is not None  # its deletion cascades to the cycle
            plan = await plan_routing(ctx, evaluation, self.mode, learned, self.cfg.min_confidence)
            request_routed(ctx, cycle, agent, data.settings, evaluation, plan)
            log.info(
                "adapters requested on the tasks routed to them",
                cycle=str(cycle.id),
                tasks={name: len(tasks) for name, tasks in evaluation.played_on.items()},
            )
        if evaluation.complete():
            agent = await ctx.session.get(Agent, cycle.agent_id)
            assert agent is not None  # its deletion cascades to the cycle
            decided = await decide(
                ctx,
                cycle,
                agent,
                data,
                self.mode,
                learned=learned,
                min_confidence=self.cfg.min_confidence,
            )
            data.report = decided.report
            cycle.reason = decided.verdict.reason
            machine.move(cycle, State.COMPLETED, type(msg).__name__)
            promoted = decided.verdict.promote
            ctx.emit(
                CycleCompleted(
                    cycle_id=cycle.id,
                    outcome="promoted" if promoted else "rejected",
                    reason=decided.verdict.reason,
                )
            )
            log.info("cycle completed", cycle=str(cycle.id), promoted=promoted)
        save(cycle, data)

    # -- helpers -----------------------------------------------------------------------------

    async def _cycle(
        self, ctx: HandlerContext, cycle_id: uuid.UUID | None, state: State
    ) -> Cycle | None:
        """The cycle when it is in `state`; None for no cycle or another state (a repeat)."""
        if cycle_id is None:
            return None
        cycle = await ctx.session.get(Cycle, cycle_id, with_for_update=True)
        if cycle is None or cycle.state != state:
            return None
        return cycle

    def _fail(self, ctx: HandlerContext, cycle: Cycle, why: str, on: str) -> None:
        machine.move(cycle, State.FAILED, on)
        cycle.error = why
        cycle.reason = why
        ctx.emit(CycleCompleted(cycle_id=cycle.id, outcome="failed", reason=why))
        log.warning("cycle failed", cycle=str(cycle.id), reason=why)


def _new_cycle(
    ctx: HandlerContext,
    msg: CycleRequested,
    agent: Agent,
    state: State,
    data: CycleData,
    on: str,
    requested: Cycle | None = None,
) -> Cycle:
    """The requested cycle's row, starting in `state` (a first step of the table): the row
    the control API recorded (`requested`), else a new one."""
    if requested is not None:
        machine.move(requested, state, on)
        save(requested, data)
        return requested
    if not machine.allowed(None, state, on):
        raise machine.IllegalTransition(f"a cycle cannot start {state} on {on}")
    cycle = Cycle(
        id=msg.cycle_id, agent_id=agent.id, state=state, trigger=msg.trigger, reason=msg.reason
    )
    save(cycle, data)
    ctx.session.add(cycle)
    return cycle


def _refused(
    ctx: HandlerContext,
    msg: CycleRequested,
    agent: Agent,
    why: str,
    on: str,
    requested: Cycle | None,
) -> None:
    """The requested cycle recorded as failed before it started, saying why."""
    data = CycleData(settings=msg.settings)
    failed = _new_cycle(ctx, msg, agent, State.FAILED, data, on, requested)
    failed.error = failed.reason = why
    ctx.emit(CycleCompleted(cycle_id=msg.cycle_id, outcome="failed", reason=why))
    log.warning("cycle refused", cycle=str(msg.cycle_id), reason=why)


def _listed(failures: dict[str, str]) -> str:
    """Each stage failure's reason, for a person (the ids are in the cycle's data)."""
    return "; ".join(sorted(set(failures.values()))) or "no reason given"
