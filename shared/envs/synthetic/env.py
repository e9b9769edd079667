"""SyntheticEnvironment: a spec's tasks, played over the toolbox's real tools and world.

An episode builds the toolbox world from the task's fixture (the episode seed lays the
background around it), offers only the task's tools with the toolbox's exact schemas and
implementations, answers text with the toolbox's scripted user, and grades with the spec's
weighted checks. Every tool call goes through `ToolBox.call`, so a malformed call, an unknown
tool or a bad argument comes back to the agent as an error, never as a crash.
"""

from __future__ import annotations

from typing import Any

from shared.envs.protocol import Score, TaskSpec
from shared.envs.synthetic.scoring import score
from shared.envs.synthetic.spec import InvalidSpecError, SyntheticSpec
from shared.envs.synthetic.target import offered_toolbox, toolbox_schemas
from shared.envs.synthetic.tasks import generate_tasks
from shared.envs.synthetic.validation import validate
from shared.envs.toolbox.checks import Trace
from shared.envs.toolbox.env import ToolboxEpisode
from shared.envs.tools import ToolBox


class SyntheticEpisode(ToolboxEpisode):
    """A toolbox episode offering only the task's tools and graded by the spec's checks."""

    def __init__(self, task: TaskSpec, seed: int) -> None:
        super().__init__(task, seed)
        self.hint: str = str(task.data.get("hint", ""))
        """Guidance for hinted training rollouts (see shared/envs/guidance.py)."""

    def _make_toolbox(self, data: dict[str, Any]) -> ToolBox:
        return offered_toolbox(self.world, data["tools"], data["faults"])

    def _grade(self, data: dict[str, Any], trace: Trace) -> Score:
        return score(data, trace)


class SyntheticEnvironment:
    """The environment a valid spec describes; an invalid spec raises `InvalidSpecError`."""

    def __init__(self, spec: SyntheticSpec) -> None:
        problems = validate(spec, toolbox_schemas())
        if problems:
            raise InvalidSpecError(f"spec {spec.name!r}: " + "; ".join(problems))
        self.spec = spec
        self.name = f"synthetic/{spec.name}"
        self._tasks: tuple[TaskSpec, ...] | None = None

    def tasks(self) -> list[TaskSpec]:
        if self._tasks is None:
            self._tasks = tuple(generate_tasks(self.spec))
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> SyntheticEpisode:
        return SyntheticEpisode(task, seed)
