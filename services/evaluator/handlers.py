"""Handlers of the evaluator service: the cycle's transitions and its evaluation.

One handler per event that can complete a stage (see cycle.py for the states); each loads
the cycle, checks the state it expects, records what the event brings, and moves on when the
stage is complete. The evaluation scores base, each adapter, the production configuration
and the routed set on the same test tasks and seeds, and promotes the routed set only when
it is significantly better than production.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import msgspec
from sqlalchemy import select

from services.evaluator import cycle as c
from services.evaluator.config import EvaluatorConfig
from services.evaluator.report import Verdict, compare, config_stats, oracle, verdict
from shared import embeddings
from shared.bus.delivery import Handler, HandlerContext
from shared.envs.protocol import Split
from shared.envs.registry import get_environment
from shared.envs.selection import pick_tasks
from shared.logging import get_logger
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
    Sampling,
    SynthesisFailed,
    TrainingFailed,
    TrainRequested,
)
from shared.routing.modes import (
    BaseOnly,
    Candidate,
    EmbeddingRouting,
    Example,
    LearnedRouting,
    RoutingMode,
)
from shared.routing.profiles import first_user_text, profiles
from shared.store.models import (
    Adapter,
    Agent,
    Cycle,
    Environment,
    Evaluation,
    Task,
    TrainingJob,
    Trajectory,
)

log = get_logger(__name__)
Outcomes = dict[str, list[tuple[bool, float]]]


class EvaluatorHandlers:
    def __init__(self, cfg: EvaluatorConfig, mode: RoutingMode | None = None) -> None:
        self.cfg = cfg
        if mode is None:
            mode = (
                EmbeddingRouting(embeddings.default_embedder(), cfg.min_confidence)
                if embeddings.available()
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
        if await ctx.session.get(Cycle, msg.cycle_id) is not None:
            return  # a repeat
        agent = await ctx.session.get(Agent, msg.agent_id)
        settings = msgspec.to_builtins(msg.settings)
        if agent is None:
            # no agent row to hang a cycle on (the foreign key): nothing to record
            log.warning("cycle requested for an unknown agent", agent=str(msg.agent_id))
            return
        active = await ctx.session.scalar(
            select(Cycle).where(Cycle.agent_id == agent.id, Cycle.state.in_(c.ACTIVE))
        )
        if active is not None:
            why = f"{agent.name} already has an active cycle ({active.id}, {active.state})"
            ctx.session.add(
                Cycle(
                    id=msg.cycle_id,
                    agent_id=agent.id,
                    state=c.FAILED,
                    trigger=msg.trigger,
                    reason=msg.reason,
                    data={"settings": settings},
                    error=why,
                )
            )
            ctx.emit(CycleCompleted(cycle_id=msg.cycle_id, outcome="failed", reason=why))
            return
        env = get_environment(agent.environment)
        tasks = pick_tasks(
            [t for t in env.tasks() if t.split == "train"], msg.settings.diagnose_tasks
        )
        request_id = uuid.uuid4()
        ctx.session.add(
            Cycle(
                id=msg.cycle_id,
                agent_id=agent.id,
                state=c.DIAGNOSING,
                trigger=msg.trigger,
                reason=msg.reason,
                data={"settings": settings, "diagnosis": str(request_id)},
            )
        )
        ctx.emit(
            RolloutRequested(
                request_id=request_id,
                agent_id=agent.id,
                environment=agent.environment,
                split="train",
                task_ids=[t.id for t in tasks],
                trials=msg.settings.diagnose_trials,
                sampling=Sampling(
                    temperature=msg.settings.temperature, max_tokens=msg.settings.max_tokens
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
        cycle = await self._cycle(ctx, msg.cycle_id, c.DIAGNOSING)
        if cycle is None:
            return
        if not msg.capability_ids:
            await self._untrained(
                ctx,
                cycle,
                "the diagnosis kept no capability: no behaviour separated the failed "
                "trajectories from the successful ones (see `retrace capabilities`)",
            )
            return
        cycle.state = c.SYNTHESIZING
        early = dict(cycle.data.get("early_settlements", {}))
        cycle.data = {
            **{k: v for k, v in cycle.data.items() if k != "early_settlements"},
            "capabilities": [str(i) for i in msg.capability_ids],
            "reserves": [str(i) for i in msg.reserve_ids],
            "environments": {},
        }
        # the synthesize service also consumes capabilities.identified and may have settled
        # some before this handler ran: apply them now (their order does not change the outcome)
        for capability, (environment, why) in early.items():
            if cycle.state != c.SYNTHESIZING:
                break
            await self._apply_settlement(ctx, cycle, capability, environment, why)

    async def environment_ready(self, msg: EnvironmentReady, ctx: HandlerContext) -> None:
        await self._settled(ctx, msg.cycle_id, msg.capability_id, str(msg.environment_id))

    async def synthesis_failed(self, msg: SynthesisFailed, ctx: HandlerContext) -> None:
        await self._settled(ctx, msg.cycle_id, msg.capability_id, None, msg.reason)

    async def _settled(
        self,
        ctx: HandlerContext,
        cycle_id: uuid.UUID | None,
        capability_id: uuid.UUID,
        environment_id: str | None,
        why: str = "",
    ) -> None:
        if cycle_id is None:
            return
        cycle = await ctx.session.get(Cycle, cycle_id, with_for_update=True)
        if cycle is not None and cycle.state == c.DIAGNOSING:
            # synthesis settled a capability before `capabilities.identified` reached this
            # service (both consume it): keep it until that message moves the cycle on
            early = {**cycle.data.get("early_settlements", {})}
            early.setdefault(str(capability_id), [environment_id, why])
            cycle.data = {**cycle.data, "early_settlements": early}
            log.info("a capability settled early; kept", cycle=str(cycle_id))
            return
        if cycle is None or cycle.state != c.SYNTHESIZING:
            return
        await self._apply_settlement(ctx, cycle, str(capability_id), environment_id, why)

    async def _apply_settlement(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        capability_id: str,
        environment_id: str | None,
        why: str,
    ) -> None:
        """One capability's synthesis outcome; once every capability has one, the jobs."""
        if capability_id not in cycle.data.get("capabilities", []):
            return
        if capability_id in cycle.data.get("environments", {}):
            return  # settled before: a redelivery
        envs = {**cycle.data.get("environments", {}), capability_id: environment_id}
        failures = {**cycle.data.get("synthesis_failures", {})}
        if environment_id is None:
            failures[capability_id] = why
        cycle.data = {**cycle.data, "environments": envs, "synthesis_failures": failures}
        reserves = list(cycle.data.get("reserves", []))
        if environment_id is None and reserves:
            # the next-best kept capability takes the failed one's place in the budget
            stand_in = reserves.pop(0)
            cycle.data = {
                **cycle.data,
                "capabilities": [*cycle.data["capabilities"], stand_in],
                "reserves": reserves,
            }
            ctx.emit(
                CapabilitiesIdentified(
                    agent_id=cycle.agent_id,
                    capability_ids=[uuid.UUID(stand_in)],
                    cycle_id=cycle.id,
                )
            )
            log.info(
                "no environment for a capability: the next one in reserve is synthesized",
                cycle=str(cycle.id),
                failed=capability_id,
                next=stand_in,
            )
        if set(envs) < set(cycle.data["capabilities"]):
            return
        ready = {cap: env for cap, env in envs.items() if env is not None}
        if not ready:
            await self._untrained(
                ctx, cycle, f"no capability got a calibrated environment: {_listed(failures)}"
            )
            return
        settings = cycle.settings
        base_config: dict[str, Any] = {"agent_id": str(cycle.agent_id)}
        if settings.rollout_budget is not None:
            base_config["rollout_budget"] = settings.rollout_budget
        jobs: dict[str, str | None] = {}
        for capability, environment in sorted(ready.items()):
            job_id = await self._queue_job(
                ctx, cycle, uuid.UUID(environment), uuid.UUID(capability), base_config,
                key=f"job-{capability}",
            )  # fmt: skip
            jobs[str(job_id)] = None
        baselines: dict[str, str] = {}
        agent = await ctx.session.get(Agent, cycle.agent_id)
        # the target's row exists: the diagnosis rollout imported its tasks
        target = (
            await ctx.session.scalar(
                select(Environment).where(
                    Environment.name == agent.environment, Environment.kind == "target"
                )
            )
            if agent is not None and settings.baselines
            else None
        )
        for name in settings.baselines:
            if target is None:
                break
            # equal budget: as many rollouts as all the capability adapters together
            config = {**base_config, "budget_multiplier": len(ready)}
            if name == "gepa":
                config["kind"] = "gepa"
            job_id = await self._queue_job(
                ctx, cycle, target.id, None, config, key=f"baseline-{name}"
            )
            jobs[str(job_id)] = None
            baselines[str(job_id)] = name
        cycle.state = c.TRAINING
        cycle.data = {**cycle.data, "jobs": jobs, "baseline_jobs": baselines}

    async def _queue_job(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        environment_id: uuid.UUID,
        capability_id: uuid.UUID | None,
        config: dict[str, Any],
        *,
        key: str,
    ) -> uuid.UUID:
        """A training job row of the cycle, and its `train.requested`."""
        job = TrainingJob(
            environment_id=environment_id,
            capability_id=capability_id,
            cycle_id=cycle.id,
            config=dict(config),
        )
        ctx.session.add(job)
        await ctx.session.flush()
        ctx.emit(
            TrainRequested(
                job_id=job.id,
                environment_id=environment_id,
                capability_id=capability_id,
                cycle_id=cycle.id,
            ),
            key=key,
        )
        return job.id

    # -- training and evaluation -------------------------------------------------------------

    async def adapter_trained(self, msg: AdapterTrained, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg.cycle_id, msg.job_id, str(msg.adapter_id))

    async def prompt_optimized(self, msg: PromptOptimized, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg.cycle_id, msg.job_id, c.PROMPT)

    async def training_failed(self, msg: TrainingFailed, ctx: HandlerContext) -> None:
        await self._job_settled(ctx, msg.cycle_id, msg.job_id, c.JOB_FAILED, msg.reason)

    async def _job_settled(
        self,
        ctx: HandlerContext,
        cycle_id: uuid.UUID | None,
        job_id: uuid.UUID,
        outcome: str,
        why: str = "",
    ) -> None:
        cycle = await self._cycle(ctx, cycle_id, c.TRAINING)
        if cycle is None or str(job_id) not in cycle.data.get("jobs", {}):
            return
        jobs = {**cycle.data["jobs"], str(job_id): outcome}
        failures = {**cycle.data.get("training_failures", {})}
        if outcome == c.JOB_FAILED:
            failures[str(job_id)] = why
        cycle.data = {**cycle.data, "jobs": jobs, "training_failures": failures}
        if any(v is None for v in jobs.values()):
            return
        baseline_jobs: dict[str, str] = cycle.data.get("baseline_jobs", {})
        trained = [v for j, v in jobs.items() if v != c.JOB_FAILED and j not in baseline_jobs]
        baselines = {
            c.baseline_config(name): j
            for j, name in baseline_jobs.items()
            if jobs.get(j) not in (None, c.JOB_FAILED)
        }
        if not trained and not baselines:
            await self._untrained(ctx, cycle, f"no adapter was trained: {_listed(failures)}")
            return
        adapters = list(
            await ctx.session.scalars(select(Adapter).where(Adapter.id.in_(c.ids(trained))))
        )
        configs: dict[str, tuple[str | None, str | None]] = {}
        for config_name, job_key in baselines.items():
            outcome = jobs[job_key]
            if outcome == c.PROMPT:
                baseline_job = await ctx.session.get(TrainingJob, uuid.UUID(job_key))
                prompt = ((baseline_job.config if baseline_job else {}).get("result") or {}).get(
                    "prompt"
                )
                if prompt is not None:
                    configs[config_name] = (None, str(prompt))
                continue
            baseline = await ctx.session.get(Adapter, uuid.UUID(str(outcome)))
            if baseline is not None:
                configs[config_name] = (baseline.name, None)
        if not trained:
            cycle.data = {**cycle.data, "untrained": f"no adapter was trained: {_listed(failures)}"}
        await self._evaluate(ctx, cycle, adapters, configs)

    async def _untrained(self, ctx: HandlerContext, cycle: Cycle, why: str) -> None:
        """Nothing to train or nothing trained: the cycle still measures the agent as it is on
        the test split (the base model and the production adapters), so its report says where
        the agent stands, and completes without promoting anything, saying why."""
        cycle.data = {**cycle.data, "untrained": why}
        log.warning("cycle has nothing to promote; evaluating as is", cycle=str(cycle.id), why=why)
        await self._evaluate(ctx, cycle, [], {})

    async def _evaluate(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        adapters: list[Adapter],
        extra: dict[str, tuple[str | None, str | None]],
    ) -> None:
        """Request the evaluation rollouts: the base model, each new adapter, the production
        adapters and `extra` configurations (name -> adapter, system prompt override)."""
        agent = await ctx.session.get(Agent, cycle.agent_id)
        if agent is None:
            self._fail(ctx, cycle, "the agent was deleted")
            return
        production = [
            a
            for a in await ctx.session.scalars(
                select(Adapter).where(Adapter.id.in_(c.ids(agent.production_adapters or [])))
            )
            if a.id not in {x.id for x in adapters}
        ]
        settings = cycle.settings
        env = get_environment(agent.environment)
        tasks = pick_tasks([t for t in env.tasks() if t.split == "test"], settings.eval_tasks)
        configs: dict[str, tuple[str | None, str | None]] = {c.BASE: (None, None)}
        configs.update({c.adapter_config(a.name): (a.name, None) for a in [*adapters, *production]})
        configs.update(extra)
        test = [t.id for t in tasks]
        requests = {
            name: self._request_rollout(
                ctx,
                cycle,
                agent,
                settings,
                "test",
                test,
                settings.eval_trials,
                adapter,
                system_prompt,
                key=f"eval-{name}",
            )
            for name, (adapter, system_prompt) in configs.items()
        }
        if settings.route_tasks > 0 and adapters:
            # the learned router's data: which configuration wins which train task
            train = pick_tasks([t for t in env.tasks() if t.split == "train"], settings.route_tasks)
            for name, adapter in [
                (c.BASE, None),
                *[(c.adapter_config(a.name), a.name) for a in adapters],
            ]:
                requests[c.ROUTE + name] = self._request_rollout(
                    ctx, cycle, agent, settings, "train", [t.id for t in train], 1, adapter,
                    None, key=f"route-{name}",
                )  # fmt: skip
        cycle.state = c.EVALUATING
        cycle.data = {
            **cycle.data,
            "evaluations": requests,
            "evaluated": [],
            "adapters": [str(a.id) for a in adapters],
            "production": [str(a.id) for a in production],
        }

    def _request_rollout(
        self,
        ctx: HandlerContext,
        cycle: Cycle,
        agent: Agent,
        settings: CycleSettings,
        split: Split,
        task_ids: list[str],
        trials: int,
        adapter: str | None,
        system_prompt: str | None,
        *,
        key: str,
    ) -> str:
        """Ask for one evaluation rollout (the cycle's sampling and seed); its request id."""
        request_id = uuid.uuid4()
        ctx.emit(
            RolloutRequested(
                request_id=request_id,
                agent_id=agent.id,
                environment=agent.environment,
                split=split,
                task_ids=task_ids,
                trials=trials,
                sampling=Sampling(
                    temperature=settings.temperature,
                    max_tokens=settings.max_tokens,
                    seed=settings.seed,
                ),
                adapter=adapter,
                cycle_id=cycle.id,
                purpose="evaluate",
                system_prompt=system_prompt,
            ),
            key=key,
        )
        return str(request_id)

    async def rollout_completed(self, msg: RolloutCompleted, ctx: HandlerContext) -> None:
        if msg.purpose != "evaluate":
            return
        cycle = await self._cycle(ctx, msg.cycle_id, c.EVALUATING)
        if cycle is None:
            return
        requests: dict[str, str] = cycle.data.get("evaluations", {})
        done = set(cycle.data.get("evaluated", []))
        names = [name for name, rid in requests.items() if rid == str(msg.request_id)]
        if not names:
            return
        done.update(names)
        cycle.data = {**cycle.data, "evaluated": sorted(done)}
        if done >= set(requests):
            await self._decide(ctx, cycle)

    async def _decide(self, ctx: HandlerContext, cycle: Cycle) -> None:
        agent = await ctx.session.get(Agent, cycle.agent_id)
        assert agent is not None
        settings = cycle.settings
        requests: dict[str, str] = cycle.data["evaluations"]
        outcomes: dict[str, Outcomes] = {}
        openings: dict[str, str] = {}
        kinds: dict[str, str] = {}
        route_outcomes: dict[str, Outcomes] = {}
        route_openings: dict[str, str] = {}
        for name, request_id in requests.items():
            if name.startswith(c.ROUTE):
                route_outcomes[name[len(c.ROUTE) :]] = await self._outcomes(
                    ctx, uuid.UUID(request_id), route_openings, {}
                )
                continue
            outcomes[name] = await self._outcomes(ctx, uuid.UUID(request_id), openings, kinds)
        new = await profiles(ctx.session, c.ids(cycle.data["adapters"]), examples=32)
        old = await profiles(ctx.session, c.ids(cycle.data["production"]), examples=32)
        examples = learn_examples(route_outcomes, route_openings)
        mode = self.mode
        if self.cfg.routing_mode == "learned" and examples and embeddings.available():
            mode = LearnedRouting(embeddings.default_embedder(), examples, self.cfg.min_confidence)
        routed, decisions = await self._route(outcomes, openings, new, mode)
        outcomes[c.ROUTED] = routed
        if old:
            outcomes[c.PRODUCTION], _ = await self._route(outcomes, openings, old, self.mode)
            incumbent = c.PRODUCTION
        else:
            incumbent = c.BASE
        stats = {name: config_stats(name, o, kinds) for name, o in outcomes.items()}
        comparison = compare(c.ROUTED, routed, incumbent, outcomes[incumbent], seed=settings.seed)
        ceiling = oracle(
            {k: v for k, v in outcomes.items() if k == c.BASE or k.startswith("adapter:")}
        )
        versus = {
            name: msgspec.to_builtins(
                compare(c.ROUTED, routed, name, outcomes[name], seed=settings.seed)
            )
            for name in outcomes
            if name.startswith("baseline:")
        }
        judged = verdict(comparison, settings.alpha)
        untrained = cycle.data.get("untrained")
        if untrained:
            judged = Verdict(promote=False, reason=f"nothing to promote: {untrained}")
        for name, s in stats.items():
            ctx.session.add(
                Evaluation(
                    cycle_id=cycle.id,
                    agent_id=agent.id,
                    configuration=name,
                    results=[
                        {
                            "task": task,
                            "trials": len(trials),
                            "successes": sum(ok for ok, _ in trials),
                            "mean_reward": sum(r for _, r in trials) / len(trials),
                        }
                        for task, trials in sorted(outcomes[name].items())
                    ],
                    summary=msgspec.to_builtins(s),
                )
            )
        report = {
            "rollouts_spent": await self._spent(ctx, cycle, list(stats)),
            "configs": {k: msgspec.to_builtins(v) for k, v in stats.items()},
            "comparison": msgspec.to_builtins(comparison),
            "oracle": ceiling,
            "routing": decisions,
            "verdict": msgspec.to_builtins(judged),
            "incumbent": incumbent,
            "baselines": versus,
            "routing_mode": mode.name,
            "untrained": untrained,
            "router_examples": [{"text": e.text, "adapter": e.adapter} for e in examples],
        }
        cycle.data = {**cycle.data, "report": report}
        cycle.reason = judged.reason
        cycle.state = c.COMPLETED
        if judged.promote:
            agent.production_adapters = list(cycle.data["adapters"])
            agent.config = {
                **(agent.config or {}),
                "router": {"examples": report["router_examples"]},
            }
        ctx.emit(
            CycleCompleted(
                cycle_id=cycle.id,
                outcome="promoted" if judged.promote else "rejected",
                reason=judged.reason,
            )
        )
        log.info("cycle completed", cycle=str(cycle.id), promoted=judged.promote)

    async def _spent(self, ctx: HandlerContext, cycle: Cycle, names: list[str]) -> dict[str, int]:
        """Training rollouts behind each configuration (base 0; the routed set: all its
        adapters'; a baseline: its own, the same budget by construction)."""
        per_adapter: dict[str, int] = {}
        for job in await ctx.session.scalars(
            select(TrainingJob).where(TrainingJob.cycle_id == cycle.id)
        ):
            rollouts = int((job.config.get("progress") or {}).get("rollouts", 0))
            if job.config.get("kind") == "gepa":
                per_adapter[c.baseline_config("gepa")] = rollouts
                continue
            produced = cycle.data.get("jobs", {}).get(str(job.id)) or job.adapter_id
            if produced in (None, c.JOB_FAILED, c.PROMPT):
                continue
            adapter = await ctx.session.get(Adapter, uuid.UUID(str(produced)))
            if adapter is None:
                continue
            curve = adapter.training_curve or []
            used = int(curve[-1]["rollouts"]) if curve else rollouts
            if job.capability_id is None:
                per_adapter[c.baseline_config("grpo_target")] = used
            else:
                per_adapter[c.adapter_config(adapter.name)] = used
        spent = {}
        for name in names:
            if name == c.ROUTED:
                spent[name] = sum(v for k, v in per_adapter.items() if k.startswith("adapter:"))
            else:
                spent[name] = per_adapter.get(name, 0)
        return spent

    async def _outcomes(
        self,
        ctx: HandlerContext,
        request_id: uuid.UUID,
        openings: dict[str, str],
        kinds: dict[str, str],
    ) -> Outcomes:
        rows = await ctx.session.execute(
            select(
                Task.external_id,
                Task.kind,
                Trajectory.trial,
                Trajectory.success,
                Trajectory.reward,
                Trajectory.messages,
            )
            .join(Task, Task.id == Trajectory.task_id)
            .where(Trajectory.request_id == request_id)
            .order_by(Task.external_id, Trajectory.trial)
        )
        out: dict[str, list[tuple[bool, float]]] = defaultdict(list)
        for task, kind, _, success, reward, messages in rows:
            out[task].append((bool(success), float(reward or 0.0)))
            kinds[task] = kind
            openings.setdefault(task, first_user_text(messages))
        return dict(out)

    async def _route(
        self,
        outcomes: dict[str, Outcomes],
        openings: dict[str, str],
        candidates: list[Candidate],
        mode: RoutingMode,
    ) -> tuple[Outcomes, dict[str, str]]:
        """The routed configuration's outcomes: per task, those of the configuration the
        routing mode picks from the task's opening request (same tasks, same seeds)."""
        routed: Outcomes = {}
        decisions: dict[str, str] = {}
        for task, trials in outcomes[c.BASE].items():
            decision = await mode.decide(openings.get(task, ""), candidates)
            name = c.adapter_config(decision.adapter.name) if decision.adapter else c.BASE
            routed[task] = outcomes.get(name, {}).get(task, trials)
            decisions[task] = name
        return routed, decisions

    # -- helpers -----------------------------------------------------------------------------

    async def _cycle(
        self, ctx: HandlerContext, cycle_id: uuid.UUID | None, state: str
    ) -> Cycle | None:
        """The cycle when it is in `state`; None for no cycle or another state (a repeat)."""
        if cycle_id is None:
            return None
        cycle = await ctx.session.get(Cycle, cycle_id, with_for_update=True)
        if cycle is None or cycle.state != state:
            return None
        return cycle

    def _fail(self, ctx: HandlerContext, cycle: Cycle, why: str) -> None:
        cycle.state = c.FAILED
        cycle.error = why
        cycle.reason = why
        ctx.emit(CycleCompleted(cycle_id=cycle.id, outcome="failed", reason=why))
        log.warning("cycle failed", cycle=str(cycle.id), reason=why)


def _listed(failures: dict[str, str]) -> str:
    """Each stage failure's reason, for a person (the ids are in the cycle's data)."""
    return "; ".join(sorted(set(failures.values()))) or "no reason given"


def learn_examples(route: dict[str, Outcomes], openings: dict[str, str]) -> list[Example]:
    """Per train task, the configuration with the best mean reward (the base model unless
    an adapter does strictly better), as the learned router's examples."""
    base = route.get(c.BASE, {})
    out = []
    for task, trials in sorted(base.items()):

        def mean(results: list[tuple[bool, float]]) -> float:
            return sum(r for _, r in results) / len(results) if results else 0.0

        best, best_score = None, mean(trials)
        for name, results in sorted(route.items()):
            if name == c.BASE or task not in results:
                continue
            score = mean(results[task])
            if score > best_score:
                best, best_score = name.removeprefix("adapter:"), score
        if openings.get(task):
            out.append(Example(openings[task], best))
    return out
