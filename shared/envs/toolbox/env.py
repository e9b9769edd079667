"""ToolboxEnvironment: seeded episodes over the toolbox world, its tools and a scripted user.

An episode runs every tool call through `ToolBox.call` (so malformed calls come back as error
tool messages), sends a text-only assistant message to the scripted user, and keeps the full
transcript and the call records (`episode.calls`) for scoring and for mining features later.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import msgspec

from shared.envs.protocol import Message, Score, StepResult, TaskSpec, ToolCall
from shared.envs.toolbox.checks import Trace
from shared.envs.toolbox.scoring import score
from shared.envs.toolbox.tasks import generate_tasks
from shared.envs.toolbox.tools import build_toolbox
from shared.envs.toolbox.user import ScriptedUser
from shared.envs.toolbox.world import World, build_world
from shared.envs.tools import CallRecord, ToolBox

SYSTEM_PROMPT = """\
You are an assistant running on the user's phone. You act only through the tools you are \
given: contacts, text messages, alarms, reminders, calendar, notes, device settings, currency \
exchange and weather.
- Use the tools to do what the user asks; look things up (contacts, ids, today's date) rather \
than guessing.
- If the request is missing a detail you need, ask the user for it before changing anything.
- If something cannot be done with these tools, or the information does not exist, say so \
plainly and change nothing.
- If a tool call fails, read the error, then fix the call or retry it.
- When you are done, tell the user what you did, or give them the answer they asked for."""

MAX_STEPS = 50
"""An episode ends after this many assistant messages, whatever the agent does."""


class ToolboxEpisode:
    """An episode over the toolbox world. Subclasses (synthetic environments) change which
    tools are offered (`_make_toolbox`) and how the episode is graded (`_grade`)."""

    def __init__(self, task: TaskSpec, seed: int) -> None:
        data = task.data
        self.task = task
        self.seed = seed
        self.world: World = build_world(data["world"], data["seed"], seed)
        self._initial = copy.deepcopy(self.world)
        self._toolbox = self._make_toolbox(data)
        self._user = ScriptedUser(data.get("user_replies", []))
        self.system_prompt = SYSTEM_PROMPT
        self.tools: list[dict[str, Any]] = self._toolbox.schemas()
        self.messages: list[Message] = [Message(role="user", content=data["request"])]
        self.transcript: list[Message] = list(self.messages)
        """The whole conversation after the system prompt, step results included."""
        self._opening = len(self.messages)
        self.done = False
        self.steps = 0

    @property
    def calls(self) -> list[CallRecord]:
        """Every tool call so far, in order, with its arguments and outcome."""
        return self._toolbox.calls

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            return StepResult(messages=[], done=True)
        self.steps += 1
        self.transcript.append(assistant)
        replies: list[Message] = []
        if assistant.tool_calls:
            replies = [self._call(call) for call in assistant.tool_calls]
        else:
            answer = self._user.respond(assistant.content or "")
            if answer is None:
                self.done = True
            else:
                replies = [Message(role="user", content=answer)]
        self.transcript.extend(replies)
        self.done = self.done or self.steps >= MAX_STEPS
        return StepResult(messages=replies, done=self.done)

    def _call(self, call: ToolCall) -> Message:
        return self._toolbox.call(call)

    def _make_toolbox(self, data: dict[str, Any]) -> ToolBox:
        return build_toolbox(self.world, data.get("faults", []))

    def _grade(self, data: dict[str, Any], trace: Trace) -> Score:
        return score(data, trace)

    def score(self) -> Score:
        trace = Trace(
            initial=self._initial,
            world=self.world,
            transcript=list(self.transcript),
            calls=list(self.calls),
            opening=self._opening,
        )
        return self._grade(self.task.data, trace)


class ToolboxEnvironment:
    name = "toolbox"

    def tasks(self) -> list[TaskSpec]:
        return list(_all_tasks())

    def reset(self, task: TaskSpec, seed: int) -> ToolboxEpisode:
        return ToolboxEpisode(task, seed)


@cache
def _all_tasks() -> tuple[TaskSpec, ...]:
    return tuple(generate_tasks())


def reference_messages(task: TaskSpec) -> list[Message]:
    """The task's reference solution as protocol messages (replay them to reach reward 1)."""
    return [msgspec.convert(m, Message) for m in task.data["reference"]]
