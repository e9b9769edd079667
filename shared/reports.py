"""Summaries of stored trajectories: pass rate with a 95% interval, mean reward, per task kind."""

from __future__ import annotations

import uuid
from collections import defaultdict

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.stats import pass_hat_k, wilson
from shared.store.models import Task, Trajectory


class Rate(msgspec.Struct, kw_only=True, frozen=True):
    label: str
    episodes: int
    successes: int
    pass_rate: float
    ci_low: float
    ci_high: float
    mean_reward: float


class RolloutSummary(msgspec.Struct, kw_only=True, frozen=True):
    overall: Rate
    by_kind: list[Rate]
    pass_hat_k: dict[int, float]
    """pass^k for k = 1..trials (tasks with at least k trials)."""
    errors: int
    """Episodes that ended on a model or environment error."""
    tokens: int
    env_errors: int = 0
    """Episodes the environment broke: stored ungraded, left out of every rate above."""


def _rate(label: str, rows: list[tuple[bool, float]]) -> Rate:
    n = len(rows)
    wins = sum(1 for ok, _ in rows if ok)
    low, high = wilson(wins, n)
    return Rate(
        label=label,
        episodes=n,
        successes=wins,
        pass_rate=wins / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        mean_reward=sum(r for _, r in rows) / n if n else 0.0,
    )


async def summarise_request(session: AsyncSession, request_id: uuid.UUID) -> RolloutSummary:
    result = await session.execute(
        select(
            Task.external_id,
            Task.kind,
            Trajectory.success,
            Trajectory.reward,
            Trajectory.tokens,
            Trajectory.reward_breakdown,
        )
        .join(Task, Task.id == Trajectory.task_id)
        .where(Trajectory.request_id == request_id)
    )
    rows = result.all()
    by_kind: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    per_task: dict[str, list[bool]] = defaultdict(list)
    errors = tokens = 0
    broken = 0
    for external, kind, success, reward, used, breakdown in rows:
        if reward is None:  # ungraded: the environment failed, not the agent
            broken += 1
            errors += 1
            continue
        by_kind[kind].append((bool(success), float(reward)))
        per_task[external].append(bool(success))
        tokens += used or 0
        errors += 1 if (breakdown or {}).get("error") else 0
    everything = [r for group in by_kind.values() for r in group]
    trials = max((len(v) for v in per_task.values()), default=0)
    counts = [(sum(v), len(v)) for v in per_task.values()]
    return RolloutSummary(
        overall=_rate("all", everything),
        by_kind=[_rate(kind, by_kind[kind]) for kind in sorted(by_kind)],
        pass_hat_k={k: pass_hat_k(counts, k) for k in range(1, trials + 1)},
        errors=errors,
        tokens=tokens,
        env_errors=broken,
    )
