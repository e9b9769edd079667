"""The cycle's verdict: score every configuration on the test split, simulate the routed set,
compare it with the incumbent (production adapters, or the base model), write the report and
the `evaluations` rows, and promote the routed set only when it is significantly better.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import select

from services.evaluator.report import Verdict, compare, config_stats, oracle, verdict
from services.evaluator.routed import Outcomes, learn_examples, route
from services.evaluator.state import (
    BASE,
    JOB_FAILED,
    PRODUCTION,
    PROMPT,
    ROUTED,
    CycleData,
    Evaluation,
    adapter_config,
    baseline_config,
)
from shared import embeddings
from shared.bus.delivery import HandlerContext
from shared.logging import get_logger
from shared.routing.modes import EmbeddingRouting, Example, LearnedRouting, RoutingMode
from shared.routing.profiles import first_user_text, profiles
from shared.store.models import Adapter, Agent, Cycle, Task, TrainingJob, Trajectory
from shared.store.models import Evaluation as EvaluationRow

log = get_logger(__name__)


@dataclass(frozen=True)
class Decided:
    verdict: Verdict
    report: dict[str, Any]


async def decide(
    ctx: HandlerContext,
    cycle: Cycle,
    agent: Agent,
    data: CycleData,
    mode: RoutingMode,
    learned: bool,
    min_confidence: float,
) -> Decided:
    """Read every configuration's outcomes, judge the routed set, record the `evaluations`
    rows and, when it is promoted, make its adapters the agent's production set. `learned`:
    fit the router on the cycle's train-task rollouts when it has them."""
    evaluation = data.evaluation
    assert evaluation is not None
    settings = data.settings
    outcomes: dict[str, Outcomes] = {}
    openings: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for name, request_id in evaluation.requests.items():
        outcomes[name] = await _outcomes(ctx, uuid.UUID(request_id), openings, kinds)
    for name in evaluation.deferred:
        outcomes.setdefault(name, {})  # routed to no task: never played
    chosen, examples = await _router(ctx, evaluation, mode, learned, min_confidence)
    new = await profiles(ctx.session, _ids(evaluation.adapters), examples=32)
    old = await profiles(ctx.session, _ids(evaluation.production), examples=32)
    routed, decisions = await route(outcomes, openings, new, chosen)
    outcomes[ROUTED] = routed
    _check_played(evaluation, decisions)
    incumbent = BASE
    if old:
        outcomes[PRODUCTION], production_decisions = await route(outcomes, openings, old, mode)
        incumbent = PRODUCTION
        _check_played(evaluation, production_decisions)
    stats = {name: config_stats(name, o, kinds) for name, o in outcomes.items()}
    comparison = compare(ROUTED, routed, incumbent, outcomes[incumbent], seed=settings.seed)
    ceiling = None  # needs every adapter's outcome on every task
    if not evaluation.deferred:
        ceiling = oracle(
            {k: v for k, v in outcomes.items() if k == BASE or k.startswith("adapter:")}
        )
    versus = {
        name: msgspec.to_builtins(compare(ROUTED, routed, name, outcomes[name], seed=settings.seed))
        for name in outcomes
        if name.startswith("baseline:")
    }
    judged = verdict(comparison, settings.alpha)
    if data.untrained:
        judged = Verdict(promote=False, reason=f"nothing to promote: {data.untrained}")
    for name, s in stats.items():
        ctx.session.add(
            EvaluationRow(
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
    rollouts, wall_s = await _spent(ctx, cycle, data, list(stats))
    report = {
        "rollouts_spent": rollouts,
        "training_wall_s": wall_s,
        "configs": {k: msgspec.to_builtins(v) for k, v in stats.items()},
        "comparison": msgspec.to_builtins(comparison),
        "oracle": ceiling,
        "played_on": {name: len(tasks) for name, tasks in evaluation.played_on.items()},
        "routing": decisions,
        "verdict": msgspec.to_builtins(judged),
        "incumbent": incumbent,
        "baselines": versus,
        "routing_mode": chosen.name,
        "untrained": data.untrained,
        "router_examples": [{"text": e.text, "adapter": e.adapter} for e in examples],
    }
    if judged.promote:
        agent.production_adapters = list(evaluation.adapters)
        agent.config = {**(agent.config or {}), "router": {"examples": report["router_examples"]}}
    return Decided(judged, report)


async def plan_routing(
    ctx: HandlerContext,
    evaluation: Evaluation,
    mode: RoutingMode,
    learned: bool,
    min_confidence: float,
) -> dict[str, set[str]]:
    """Which test tasks each deferred adapter is to be played on: those routing sends it,
    deciding as `decide` will from the base model's openings (the new adapters for the
    routed set, the production ones for the incumbent)."""
    openings: dict[str, str] = {}
    base = {BASE: await _outcomes(ctx, uuid.UUID(evaluation.requests[BASE]), openings, {})}
    chosen, _ = await _router(ctx, evaluation, mode, learned, min_confidence)
    plan: dict[str, set[str]] = {}
    for ids, routing in ((evaluation.adapters, chosen), (evaluation.production, mode)):
        candidates = await profiles(ctx.session, _ids(ids), examples=32)
        if not candidates:
            continue
        _, decisions = await route(base, openings, candidates, routing)
        for task, name in decisions.items():
            if name != BASE:
                plan.setdefault(name, set()).add(task)
    return plan


async def _router(
    ctx: HandlerContext,
    evaluation: Evaluation,
    mode: RoutingMode,
    learned: bool,
    min_confidence: float,
) -> tuple[RoutingMode, list[Example]]:
    """The routing mode for the new adapters (the router fitted on the cycle's train-task
    rollouts when `learned` and it has them, else `mode`) and those examples."""
    route_openings: dict[str, str] = {}
    route_outcomes = {
        name: await _outcomes(ctx, uuid.UUID(request_id), route_openings, {})
        for name, request_id in evaluation.route_requests.items()
    }
    examples = learn_examples(route_outcomes, route_openings)
    # the similarity the embedding mode uses (the router's own, see EvaluatorConfig)
    exact = mode.exact if isinstance(mode, EmbeddingRouting) else None
    if learned and examples and (exact is not None or embeddings.available()):
        return (
            LearnedRouting(exact or embeddings.default_embedder(), examples, min_confidence),
            examples,
        )
    return mode, examples


def _check_played(evaluation: Evaluation, decisions: dict[str, str]) -> None:
    """A deferred adapter chosen where it was not played is scored as the base model there
    (routing decided otherwise than when it planned): said, never silently."""
    for task, name in decisions.items():
        if name in evaluation.deferred and task not in evaluation.played_on.get(name, []):
            log.warning(
                "routing chose an adapter on a task it was not played on; the base model's "
                "outcome stands in",
                task=task,
                configuration=name,
            )


async def _spent(
    ctx: HandlerContext, cycle: Cycle, data: CycleData, names: list[str]
) -> tuple[dict[str, int], dict[str, float]]:
    """Training rollouts and training wall seconds behind each configuration (base 0; the
    routed set: all its adapters'; a baseline: its own, the same budget by construction)."""
    outcomes = data.training.jobs if data.training else {}
    per_config: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for job in await ctx.session.scalars(
        select(TrainingJob).where(TrainingJob.cycle_id == cycle.id)
    ):
        rollouts = int((job.config.get("progress") or {}).get("rollouts", 0))
        wall = float(job.config.get("wall_s") or 0.0)
        if job.config.get("kind") == "gepa":
            per_config[baseline_config("gepa")] = rollouts
            seconds[baseline_config("gepa")] = wall
            continue
        produced = outcomes.get(str(job.id)) or job.adapter_id
        if produced in (None, JOB_FAILED, PROMPT):
            continue
        adapter = await ctx.session.get(Adapter, uuid.UUID(str(produced)))
        if adapter is None:
            continue
        curve = adapter.training_curve or []
        used = int(curve[-1]["rollouts"]) if curve else rollouts
        name = (
            baseline_config("grpo_target")
            if job.capability_id is None
            else adapter_config(adapter.name)
        )
        per_config[name] = used
        seconds[name] = wall
    spent, wall_s = {}, {}
    for name in names:
        if name == ROUTED:
            spent[name] = sum(v for k, v in per_config.items() if k.startswith("adapter:"))
            wall_s[name] = round(sum(v for k, v in seconds.items() if k.startswith("adapter:")), 3)
        else:
            spent[name] = per_config.get(name, 0)
            wall_s[name] = round(seconds.get(name, 0.0), 3)
    return spent, wall_s


async def _outcomes(
    ctx: HandlerContext,
    request_id: uuid.UUID,
    openings: dict[str, str],
    kinds: dict[str, str],
) -> Outcomes:
    """One rollout request's outcomes per task; fills each task's opening request and kind."""
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
    ungraded = 0
    for task, kind, _, success, reward, messages in rows:
        kinds[task] = kind
        if messages:  # an episode whose reset failed has none: not the task's opening
            openings.setdefault(task, first_user_text(messages))
        if reward is None:  # the environment broke the episode: not the configuration's doing
            ungraded += 1
            continue
        out[task].append((bool(success), float(reward)))
    if ungraded:
        log.warning(
            "episodes the environment broke left out of the evaluation",
            request=str(request_id),
            ungraded=ungraded,
        )
    return dict(out)


def _ids(values: list[str]) -> list[uuid.UUID]:
    return [uuid.UUID(v) for v in values]
