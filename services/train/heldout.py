"""An adapter's held-out check: the trained policy against the base model (the same weights
with the adapter switched off) on its environment's test tasks, unhinted, each (task, seed)
played by both with the same sampling seed, and the gain in mean reward with its 95% paired
bootstrap interval. It runs in the training thread right after the last step, on the policy
already in memory, so it costs rollouts but no model load."""

from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import dataclass
from typing import Any

from services.train.grpo import GRPOSettings, Policy, Rollout, rollout_episodes
from shared.envs.protocol import Environment, TaskSpec
from shared.stats import paired_bootstrap, wilson


@dataclass(frozen=True)
class HeldoutSettings:
    tasks: int = 8
    """Test tasks played (0: no check)."""
    samples: int = 2
    """Seeds per task, each played by both models."""
    batch: int = 24
    """Episodes run in lockstep."""
    seed: int = 0


def heldout_tasks(env: Environment, count: int, seed: int) -> list[TaskSpec]:
    tasks = sorted((t for t in env.tasks() if t.split == "test"), key=lambda t: t.id)
    random.Random(f"heldout:{seed}").shuffle(tasks)
    return tasks[:count]


def heldout(
    policy: Policy,
    env: Environment,
    s: GRPOSettings,
    h: HeldoutSettings,
    *,
    system_prompt: str = "",
) -> dict[str, Any]:
    """The check's numbers (empty when the environment has no test tasks or `h.tasks` is 0)."""
    tasks = heldout_tasks(env, h.tasks, h.seed)
    if not tasks or h.samples < 1:
        return {}
    pairs = [
        (task, random.Random(f"heldout:{h.seed}:{task.id}:{k}").randrange(2**31))
        for task in tasks
        for k in range(h.samples)
    ]
    plain = dataclasses.replace(s, hint_share=0.0)
    adapted = _play(policy, env, pairs, plain, h, system_prompt)
    with policy.model.disable_adapter():
        base = _play(policy, env, pairs, plain, h, system_prompt)
    first = [r.reward for r in base]
    second = [r.reward for r in adapted]
    gain, (low, high), p = paired_bootstrap(first, second, seed=h.seed)
    return {
        "tasks": len(tasks),
        "samples": h.samples,
        "episodes": len(pairs),
        "base_mean": round(statistics.fmean(first), 6),
        "adapter_mean": round(statistics.fmean(second), 6),
        "base_success": _successes(base),
        "adapter_success": _successes(adapted),
        "gain": round(gain, 6),
        "ci95": [round(low, 6), round(high, 6)],
        "p": round(p, 6),
        "better": low > 0,
    }


def _play(
    policy: Policy,
    env: Environment,
    pairs: list[tuple[TaskSpec, int]],
    s: GRPOSettings,
    h: HeldoutSettings,
    system_prompt: str,
) -> list[Rollout]:
    out: list[Rollout] = []
    for start in range(0, len(pairs), h.batch):
        out += rollout_episodes(
            policy,
            env,
            pairs[start : start + h.batch],
            s,
            system_prompt=system_prompt,
            sample_seed=h.seed * 7919 + start,
        )
    return out


def _successes(rollouts: list[Rollout]) -> dict[str, Any]:
    wins = sum(1 for r in rollouts if r.reward >= 1.0 - 1e-9)
    low, high = wilson(wins, len(rollouts))
    return {"rate": round(wins / len(rollouts), 6), "ci95": [round(low, 6), round(high, 6)]}
