"""`DerivedEnvironment`: a derived spec's tasks, played by the target's own episodes.

An episode is the target's episode of the task in world `world * WORLD_STRIDE + seed`, passed
through untouched (the same system prompt, tool schemas, tools and user); only the grade adds
the capability check: `(1 - w) * target reward + w * check`, with the check's share shown in
the breakdown. Success stays the target's.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from shared.envs.derived.checks import CHECKS
from shared.envs.derived.simulated import SimulatedEpisode, is_remote
from shared.envs.derived.spec import DerivedSpec
from shared.envs.protocol import Environment, Episode, Message, Score, StepResult, TaskSpec
from shared.envs.synthetic.spec import InvalidSpecError
from shared.envs.tools import CallRecord

WORLD_STRIDE = 7919
"""Seeds of different worlds never meet: a training seed stays below it."""


class DerivedEnvironment:
    def __init__(self, spec: DerivedSpec, target: Environment | None) -> None:
        """`target` is the target environment, or None for a spec replayed from its
        snapshots (`spec.simulated`), which needs nothing of the target."""
        if spec.simulated is not None:
            self._simulated(spec)
            return
        if target is None:
            raise InvalidSpecError(f"derived spec {spec.name!r}: its target is needed to replay")
        if is_remote(target):
            raise InvalidSpecError(
                f"derived spec {spec.name!r}: target {spec.target!r} starts its episodes "
                "asynchronously (HTTP, MCP): its tasks are replayed from snapshots with "
                "simulated tools (shared/envs/derived/simulated.py), which this spec has not"
            )
        if not spec.task_ids:
            raise InvalidSpecError(
                f"derived spec {spec.name!r}: target {spec.target!r} gave no train task to replay"
            )
        if spec.check is not None and spec.check not in CHECKS:
            raise InvalidSpecError(f"derived spec {spec.name!r}: unknown check {spec.check!r}")
        self.spec = spec
        self.target: Environment | None = target
        self.name = f"synthetic/{spec.name}"
        known = {t.id: t for t in target.tasks()}
        missing = [t for t in spec.task_ids if t not in known]
        if missing:
            raise InvalidSpecError(
                f"derived spec {spec.name!r}: target {spec.target!r} has no task "
                + ", ".join(repr(m) for m in missing)
            )
        self._kinds = {t: known[t].kind for t in spec.task_ids}
        self._targets = {t: known[t] for t in spec.task_ids}

    def _simulated(self, spec: DerivedSpec) -> None:
        assert spec.simulated is not None
        if spec.check not in CHECKS:
            raise InvalidSpecError(
                f"derived spec {spec.name!r}: simulated tools need a known check, "
                f"not {spec.check!r}"
            )
        openings = {t.task_id: t for t in spec.simulated}
        missing = [t for t in spec.task_ids if t not in openings]
        if not spec.task_ids or missing:
            raise InvalidSpecError(
                f"derived spec {spec.name!r}: no snapshot of "
                + (", ".join(repr(m) for m in missing) or "any task")
            )
        self.spec = spec
        self.target = None
        self.name = f"synthetic/{spec.name}"
        self._openings = openings
        self._kinds = {t: openings[t].kind for t in spec.task_ids}

    @cached_property
    def _tasks(self) -> tuple[TaskSpec, ...]:
        spec = self.spec
        out = []
        for world in range(spec.seeds):
            for number, task_id in enumerate(spec.task_ids):
                hint = spec.hints[(world + number) % len(spec.hints)] if spec.hints else ""
                out.append(
                    TaskSpec(
                        id=f"{spec.name}-{world:02d}-{task_id}",
                        kind=self._kinds[task_id],
                        split="test" if world >= spec.seeds - spec.test_seeds else "train",
                        data={"target_task": task_id, "world": world, "hint": hint},
                    )
                )
        return tuple(out)

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> DerivedEpisode | SimulatedEpisode:
        world = int(task.data["world"]) * WORLD_STRIDE + seed % WORLD_STRIDE
        if self.target is None:
            return SimulatedEpisode(
                self.spec, task, self._openings[task.data["target_task"]], world
            )
        inner = self.target.reset(self._targets[task.data["target_task"]], world)
        return DerivedEpisode(self.spec, inner, str(task.data.get("hint", "")))


class DerivedEpisode:
    def __init__(self, spec: DerivedSpec, inner: Episode, hint: str) -> None:
        self.spec = spec
        self.inner = inner
        self.hint = hint
        """Guidance for hinted rollouts (shared/envs/guidance.py)."""
        self.system_prompt = inner.system_prompt
        self.tools = inner.tools
        self.messages = inner.messages
        self.turns: list[Message] = []

    @property
    def calls(self) -> list[CallRecord]:
        return list(getattr(self.inner, "calls", []))

    def step(self, assistant: Message) -> StepResult:
        self.turns.append(assistant)
        result = self.inner.step(assistant)
        self.turns.extend(result.messages)
        return result

    def score(self) -> Score:
        graded = self.inner.score()
        if self.spec.check is None:
            return graded
        weight = self.spec.check_weight
        exercised = CHECKS[self.spec.check](self.turns, self.calls)
        breakdown: dict[str, Any] = {
            **{f"target:{k}": v * (1 - weight) for k, v in graded.breakdown.items()},
            f"capability:{self.spec.check}": weight * exercised,
        }
        return Score(
            reward=round((1 - weight) * graded.reward + weight * exercised, 6),
            success=graded.success,
            breakdown=breakdown,
            notes=[*graded.notes, f"{self.spec.check}: {exercised:.2f}"],
        )
