"""The training jobs of a cycle: one per ready environment, and the baselines beside them.

Each job is a `training_jobs` row and its `train.requested`, written in the handler's
transaction (the message goes out when it commits); train workers claim the rows.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from services.evaluator.state import Training
from shared.bus.delivery import HandlerContext
from shared.messages import CycleSettings, TrainRequested
from shared.store.models import Agent, Cycle, Environment, TrainingJob


async def queue_job(
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


async def queue_stage(
    ctx: HandlerContext, cycle: Cycle, settings: CycleSettings, ready: dict[str, str]
) -> Training:
    """One GRPO job per capability -> environment in `ready`, and each baseline the settings
    name on the agent's target environment, at the same budget as all the adapters together."""
    base_config: dict[str, Any] = {"agent_id": str(cycle.agent_id)}
    if settings.rollout_budget is not None:
        base_config["rollout_budget"] = settings.rollout_budget
    jobs: dict[str, str | None] = {}
    for capability, environment in sorted(ready.items()):
        job_id = await queue_job(
            ctx, cycle, uuid.UUID(environment), uuid.UUID(capability), base_config,
            key=f"job-{capability}",
        )  # fmt: skip
        jobs[str(job_id)] = None
    baselines: dict[str, str] = {}
    target = await _target(ctx, cycle) if settings.baselines else None
    if target is not None:
        for name in settings.baselines:
            config = {**base_config, "budget_multiplier": len(ready)}
            if name == "gepa":
                config["kind"] = "gepa"
            job_id = await queue_job(ctx, cycle, target.id, None, config, key=f"baseline-{name}")
            jobs[str(job_id)] = None
            baselines[str(job_id)] = name
    return Training(jobs=jobs, baselines=baselines)


async def _target(ctx: HandlerContext, cycle: Cycle) -> Environment | None:
    """The agent's target environment row (the diagnosis rollout imported its tasks)."""
    agent = await ctx.session.get(Agent, cycle.agent_id)
    if agent is None:
        return None
    return await ctx.session.scalar(
        select(Environment).where(
            Environment.name == agent.environment, Environment.kind == "target"
        )
    )
