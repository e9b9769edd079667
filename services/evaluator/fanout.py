"""The evaluation fan-out: one rollout request per configuration on the same test tasks and
seeds (so outcomes pair up task by task and trial by trial), and, for a learned router, one
per new configuration on train tasks. With `eval_adapters` = `routed`, the adapters wait:
once routing has chosen per task (`request_routed`), each is played on its tasks only, with
the same seeds there."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping

from services.evaluator.state import BASE, Evaluation, adapter_config
from shared.bus.delivery import HandlerContext
from shared.envs.protocol import Environment, Split
from shared.envs.selection import pick_tasks
from shared.messages import CycleSettings, RolloutRequested, Sampling
from shared.store.models import Adapter, Agent, Cycle

Configuration = tuple[str | None, str | None]
"""What one configuration plays: (adapter name or None for the base model, system prompt
override or None)."""


def request_evaluations(
    ctx: HandlerContext,
    cycle: Cycle,
    agent: Agent,
    env: Environment,
    settings: CycleSettings,
    adapters: list[Adapter],
    production: list[Adapter],
    extra: dict[str, Configuration],
) -> Evaluation:
    """Ask for the base model, each new adapter, the production adapters and `extra`
    configurations (the baselines) on the test split of the agent's environment `env`."""
    tasks = pick_tasks([t for t in env.tasks() if t.split == "test"], settings.eval_tasks)
    configs: dict[str, Configuration] = {BASE: (None, None)}
    played = {adapter_config(a.name): a.name for a in [*adapters, *production]}
    deferred = played if settings.eval_adapters == "routed" else {}
    configs.update(
        {name: (adapter, None) for name, adapter in played.items() if name not in deferred}
    )
    configs.update(extra)
    test = [t.id for t in tasks]
    requests = {
        name: _request(
            ctx,
            cycle,
            agent,
            settings,
            "test",
            test,
            settings.eval_trials,
            config,
            key=f"eval-{name}",
        )
        for name, config in configs.items()
    }
    route_requests: dict[str, str] = {}
    if settings.route_tasks > 0 and adapters:
        train = pick_tasks([t for t in env.tasks() if t.split == "train"], settings.route_tasks)
        for name, adapter in [(BASE, None), *[(adapter_config(a.name), a.name) for a in adapters]]:
            route_requests[name] = _request(
                ctx,
                cycle,
                agent,
                settings,
                "train",
                [t.id for t in train],
                1,
                (adapter, None),
                key=f"route-{name}",
            )
    return Evaluation(
        requests=requests,
        route_requests=route_requests,
        adapters=[str(a.id) for a in adapters],
        production=[str(a.id) for a in production],
        deferred=deferred,
    )


def request_routed(
    ctx: HandlerContext,
    cycle: Cycle,
    agent: Agent,
    settings: CycleSettings,
    evaluation: Evaluation,
    plan: Mapping[str, Collection[str]],
) -> None:
    """Play each deferred adapter on the test tasks routing sends it (`plan`: configuration ->
    tasks); one routed to no task is not played. Records where each was played."""
    for name, adapter in sorted(evaluation.deferred.items()):
        tasks = sorted(plan.get(name, ()))
        evaluation.played_on[name] = tasks
        if tasks:
            evaluation.requests[name] = _request(
                ctx,
                cycle,
                agent,
                settings,
                "test",
                tasks,
                settings.eval_trials,
                (adapter, None),
                key=f"eval-{name}",
            )


def _request(
    ctx: HandlerContext,
    cycle: Cycle,
    agent: Agent,
    settings: CycleSettings,
    split: Split,
    task_ids: list[str],
    trials: int,
    config: Configuration,
    *,
    key: str,
) -> str:
    """One rollout request with the cycle's sampling and seed; its request id."""
    adapter, system_prompt = config
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
