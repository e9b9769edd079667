"""One adapter's training run: GRPO steps until the rollout budget is spent, checkpointed so a
run that dies resumes where its last checkpoint left it (on this worker or another).

Tasks are the environment's train split in a seeded order, cycled; step k rolls out
`groups_per_step` groups, each task's episode seeds and sampling seeds derived from (seed,
step, group), so a resumed run repeats what the lost one would have done. With
`sample_ahead`, one sampling round rolls out the groups of the next 1 + `sample_ahead` steps
together. A checkpoint is a directory: the adapter in PEFT format, the optimizer's state,
`state.json` (step, rollouts used, the training curve) and `pending.json` (the round's groups
not yet trained on, so a resumed run trains on the very rollouts the lost one sampled); it
is written to a temporary directory and renamed into place, so a crash mid-write leaves the
previous one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.train.grpo import (
    GRPOSettings,
    Policy,
    Rollout,
    StepStats,
    Turn,
    optimizer_for,
    policy_step,
    rollout_episodes,
    rollout_group,
)
from services.train.sampling import LocalSampler, Sampler
from shared.envs.guidance import hinted_count
from shared.envs.protocol import Environment, TaskSpec

STATE = "state.json"
PENDING = "pending.json"
OPTIMIZER = "optimizer.pt"
ADAPTER = "adapter"


@dataclass(frozen=True)
class Budget:
    rollouts: int
    """Episodes the run may spend (group size x groups per step x steps)."""
    max_steps: int | None = None

    def steps(self, s: GRPOSettings) -> int:
        per_step = s.group_size * s.groups_per_step
        steps = self.rollouts // per_step
        return min(steps, self.max_steps) if self.max_steps is not None else steps


@dataclass
class Progress:
    step: int = 0
    rollouts: int = 0
    wall_s: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)
    """Per step: step, mean_reward, groups used, loss, completion tokens, grad norm, wall s,
    and the mean reward of hinted and unhinted rollouts (None where there were none)."""
    resumes: list[int] = field(default_factory=list)
    """The step each resume started from (one entry per restart from a checkpoint)."""


class Checkpoints:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def save(
        self,
        policy: Policy,
        optimizer: torch.optim.Optimizer,
        progress: Progress,
        pending: Sequence[Sequence[Sequence[Rollout]]] = (),
    ) -> None:
        """Write the checkpoint; `pending`: the next steps' groups, sampled and not yet
        trained on."""
        partial = self.directory.with_name(self.directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        policy.model.save_pretrained(partial / ADAPTER)
        torch.save(optimizer.state_dict(), partial / OPTIMIZER)
        (partial / STATE).write_text(json.dumps(asdict(progress)))
        if pending:
            steps = [[[asdict(r) for r in group] for group in step] for step in pending]
            (partial / PENDING).write_text(json.dumps({"step": progress.step, "steps": steps}))
        old = self.directory.with_name(self.directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.directory.exists():
            os.replace(self.directory, old)
        os.replace(partial, self.directory)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, policy: Policy, optimizer: torch.optim.Optimizer) -> Progress | None:
        """The saved progress, with the adapter and optimizer restored; None if none saved."""
        state = self.directory / STATE
        if not state.exists():
            return None
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        device = policy.device
        weights = load_file(
            str(self.directory / ADAPTER / "adapter_model.safetensors"), device=str(device)
        )
        set_peft_model_state_dict(policy.model, weights)
        optimizer.load_state_dict(
            torch.load(self.directory / OPTIMIZER, weights_only=True, map_location=device)
        )
        return Progress(**json.loads(state.read_text()))

    def pending(self, step: int) -> list[list[list[Rollout]]]:
        """The groups a checkpoint at `step` had sampled for the steps after it (none when
        it had none, or it is another step's)."""
        path = self.directory / PENDING
        if not path.exists():
            return []
        saved = json.loads(path.read_text())
        if saved.get("step") != step:
            return []
        return [[[_rollout(r) for r in group] for group in groups] for groups in saved["steps"]]


def _rollout(saved: dict[str, Any]) -> Rollout:
    turns = [Turn(**t) for t in saved.pop("turns")]
    return Rollout(**saved, turns=turns)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def task_order(tasks: Sequence[TaskSpec], seed: int) -> list[TaskSpec]:
    ordered = sorted(tasks, key=lambda t: t.id)
    random.Random(f"grpo-tasks:{seed}").shuffle(ordered)
    return ordered


def train(
    policy: Policy,
    env: Environment,
    s: GRPOSettings,
    budget: Budget,
    checkpoints: Checkpoints,
    *,
    system_prompt: str = "",
    checkpoint_every: int = 1,
    on_step: Callable[[Progress, StepStats], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    sampler: Sampler | None = None,
) -> Progress:
    """Run (or resume) the training; returns the progress when the budget is spent or
    `should_stop()` says so (after a checkpoint). Completions come from `sampler` (default:
    the policy in process), which is given the weights before the first rollout and after
    every step."""
    tasks = task_order([t for t in env.tasks() if t.split == "train"], s.seed)
    if not tasks:
        raise ValueError("the environment has no train tasks")
    optimizer = optimizer_for(policy, s)
    progress = checkpoints.load(policy, optimizer)
    pending: list[list[list[Rollout]]] = []
    if progress is None:
        progress = Progress()
    else:
        progress.resumes.append(progress.step)
        pending = checkpoints.pending(progress.step)
    sampler = sampler or LocalSampler(policy)
    steps = budget.steps(s)
    if progress.step < steps:
        sampler.sync(policy, progress.step)
    while progress.step < steps and not should_stop():
        started = time.perf_counter()
        if not pending:
            ahead = min(1 + s.sample_ahead, steps - progress.step)
            pending = sample_round(
                policy, env, tasks, s, progress.step, ahead, system_prompt, sampler
            )
        sampling_share = (time.perf_counter() - started) / len(pending)
        while pending:
            step_started = time.perf_counter()
            stats = policy_step(policy, optimizer, pending.pop(0), s)
            progress.step += 1
            progress.rollouts += stats.rollouts
            wall = sampling_share + time.perf_counter() - step_started
            progress.wall_s += wall
            progress.curve.append(
                {
                    "step": progress.step,
                    "mean_reward": round(stats.mean_reward, 6),
                    "groups_used": stats.used,
                    "groups": stats.groups,
                    "loss": round(stats.loss, 6),
                    "completion_tokens": stats.completion_tokens,
                    "grad_norm": round(stats.grad_norm, 6),
                    "rollouts": progress.rollouts,
                    "wall_s": round(wall, 3),
                    "hinted_reward": _rounded(stats.hinted_reward),
                    "unhinted_reward": _rounded(stats.unhinted_reward),
                }
            )
            if progress.step % checkpoint_every == 0 or progress.step == steps:
                checkpoints.save(policy, optimizer, progress, pending)
            if not pending and progress.step < steps and not should_stop():
                # after the checkpoint: a failed sync must not lose the step
                sampler.sync(policy, progress.step)
            if on_step is not None:
                on_step(progress, stats)
            if pending and should_stop():
                break  # its checkpoint, when this step wrote one, holds the round's other steps
    return progress


def sample_round(
    policy: Policy,
    env: Environment,
    tasks: Sequence[TaskSpec],
    s: GRPOSettings,
    first: int,
    steps: int,
    system_prompt: str,
    sampler: Sampler,
) -> list[list[list[Rollout]]]:
    """The groups of steps `first` .. `first + steps - 1`, per step: with `sample_ahead` 0,
    each group rolled out on its own; else all of them as one lockstep batch."""
    plan = []
    for step in range(first, first + steps):
        for j in range(s.groups_per_step):
            index = step * s.groups_per_step + j
            seeds = [
                random.Random(f"{s.seed}:{step}:{j}:{g}").randrange(2**31)
                for g in range(s.group_size)
            ]
            plan.append((tasks[index % len(tasks)], seeds, index))
    if s.sample_ahead == 0:
        groups = [
            rollout_group(
                policy,
                env,
                task,
                seeds,
                s,
                system_prompt=system_prompt,
                sample_seed=s.seed * 100_003 + index,
                sampler=sampler,
            )
            for task, seeds, index in plan
        ]
    else:
        hinted = hinted_count(s.group_size, s.hint_share)
        together = rollout_episodes(
            policy,
            env,
            [(task, seed) for task, seeds, _ in plan for seed in seeds],
            s,
            hinted=[g < hinted for _ in plan for g in range(s.group_size)],
            system_prompt=system_prompt,
            sample_seed=s.seed * 100_003 + plan[0][2],
            sampler=sampler,
        )
        size = s.group_size
        groups = [together[i : i + size] for i in range(0, len(together), size)]
    per = s.groups_per_step
    return [groups[i : i + per] for i in range(0, len(groups), per)]
