"""SyntheticEnvironment: a spec's tasks, played over the toolbox's real tools and world.

An episode builds the toolbox world from the task's fixture (the episode seed lays the
background around it), offers only the task's tools with the toolbox's exact schemas and
implementations, answers text with the toolbox's scripted user, and grades with the spec's
weighted checks. Every tool call goes through `ToolBox.call`, so a malformed call, an unknown
tool or a bad argument comes back to the agent as an error, never as a crash.
"""

from __future__ import annotations

import copy
from typing import Any

from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.envs.synthetic.scoring import score
from shared.envs.synthetic.spec import InvalidSpecError, SyntheticSpec
from shared.envs.synthetic.target import offered_toolbox, toolbox_schemas
from shared.envs.synthetic.tasks import generate_tasks
from shared.envs.synthetic.validation import validate
from shared.envs.toolbox.checks import Trace
from shared.envs.toolbox.env import MAX_STEPS, SYSTEM_PROMPT
from shared.envs.toolbox.user import ScriptedUser
from shared.envs.toolbox.world import World, build_world
from shared.envs.tools import CallRecord


class SyntheticEpisode:
    def __init__(self, task: TaskSpec, seed: int) -> None:
        data = task.data
        self.task = task
        self.seed = seed
        self.world: World = build_world(data["world"], data["seed"], seed)
        self._initial = copy.deepcopy(self.world)
        self._toolbox = offered_toolbox(self.world, data["tools"], data["faults"])
        self._user = ScriptedUser(data["user_replies"])
        self.system_prompt = SYSTEM_PROMPT
        self.tools: list[dict[str, Any]] = self._toolbox.schemas()
        self.messages: list[Message] = [Message(role="user", content=data["request"])]
        self.transcript: list[Message] = list(self.messages)
        """The whole conversation after the system prompt, step results included."""
        self.done = False
        self.steps = 0

    @property
    def calls(self) -> list[CallRecord]:
        return self._toolbox.calls

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult(messages=[], done=True)
        self.steps += 1
        self.transcript.append(assistant)
        replies: list[Message] = []
        if assistant.tool_calls:
            replies = [self._toolbox.call(call) for call in assistant.tool_calls]
        else:
            answer = self._user.respond(assistant.content or "")
            if answer is None:
                self.done = True
            else:
                replies = [Message(role="user", content=answer)]
        self.transcript.extend(replies)
        self.done = self.done or self.steps >= MAX_STEPS
        return StepResult(messages=replies, done=self.done)

    def score(self) -> Score:
        trace = Trace(
            initial=self._initial,
            world=self.world,
            transcript=list(self.transcript),
            calls=list(self.calls),
            opening=len(self.messages),
        )
        return score(self.task.data, trace)


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
