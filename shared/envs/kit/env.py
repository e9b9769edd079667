"""`TaskFileEnvironment`: the common case of a plug-in environment in one short class.

Override these, and the base runs the episodes:

    class HotelDesk(TaskFileEnvironment[Hotel]):
        name = "hotel-desk"
        task_file = Path(__file__).with_name("tasks.jsonl")
        system_prompt = "You are the front desk of a hotel..."
        tools = (search_rooms, book_room, cancel_reservation)

        def initial_state(self, task, rng): ...          # the world this episode starts from
        def reward(self, task, transcript): ...          # float in [0, 1], or a Score

Optional: `first_messages` (default: one user message, the task's `prompt` field) and
`user_reply` (default: the task's `replies`, one per assistant turn without a tool call; the
episode ends when they run out). Tools are typed functions taking the state first
(`shared.envs.kit.schema`); a tool refuses a call by raising `ToolError`, whose text the agent
reads. Everything the model sends is checked against the schemas before a tool runs, so a bad
call is data the episode records, never an exception.

An episode's state comes from `initial_state(task, rng)` with `rng` seeded by the task id and
the seed, so the same (task, seed) always gives the same episode in any process.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from shared.envs.kit.schema import enum_arguments, function_schema
from shared.envs.kit.tasks import read_tasks
from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.envs.tools import CallRecord, Tool, ToolBox

S = TypeVar("S")


@dataclass
class Transcript(Generic[S]):
    """What an episode did, for the reward: the final state, the conversation after the system
    turn, and every tool call with its outcome."""

    state: S
    messages: list[Message]
    calls: list[CallRecord]

    @property
    def final_reply(self) -> str:
        """The last assistant text (empty when the agent never wrote one)."""
        for message in reversed(self.messages):
            if message.role == "assistant" and message.content:
                return message.content
        return ""

    def called(self, name: str) -> list[CallRecord]:
        """Successful calls of one tool, in order."""
        return [c for c in self.calls if c.name == name and c.ok]


class TaskFileEnvironment(Generic[S]):
    """An environment over a task file, typed tools and a reward on the final state."""

    name: ClassVar[str]
    task_file: ClassVar[Path]
    system_prompt: ClassVar[str] = ""
    tools: ClassVar[Sequence[Callable[..., Any]]] = ()

    def initial_state(self, task: TaskSpec, rng: random.Random) -> S:
        """The world an episode of `task` starts in; draw every random choice from `rng`."""
        raise NotImplementedError(f"{type(self).__name__} must define initial_state")

    def reward(self, task: TaskSpec, transcript: Transcript[S]) -> float | Score:
        """The episode's grade in [0, 1] (a float, or a Score with its breakdown)."""
        raise NotImplementedError(f"{type(self).__name__} must define reward")

    def first_messages(self, task: TaskSpec) -> list[Message]:
        prompt = task.data.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"task {task.id!r} has no 'prompt' text; add one or override first_messages"
            )
        return [Message(role="user", content=prompt)]

    def user_reply(self, task: TaskSpec, state: S, turn: int) -> str | None:
        """The user's answer to the agent's `turn`-th reply without a tool call (from 0), or
        None to end the episode."""
        replies = task.data.get("replies") or []
        return str(replies[turn]) if turn < len(replies) else None

    # -- owned by the base ------------------------------------------------------------------
    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    @functools.cached_property
    def _tasks(self) -> tuple[TaskSpec, ...]:
        return tuple(read_tasks(Path(self.task_file)))

    @functools.cached_property
    def _schemas(self) -> tuple[dict[str, Any], ...]:
        return tuple(function_schema(fn) for fn in self.tools)

    def reset(self, task: TaskSpec, seed: int) -> KitEpisode[S]:
        state = self.initial_state(task, random.Random(f"{self.name}:{task.id}:{seed}"))
        box = ToolBox(
            {
                schema["function"]["name"]: Tool(
                    name=schema["function"]["name"],
                    description=schema["function"]["description"],
                    parameters=schema["function"]["parameters"],
                    fn=_bound(fn, state),
                )
                for fn, schema in zip(self.tools, self._schemas, strict=True)
            }
        )
        return KitEpisode(
            env=self,
            task=task,
            state=state,
            box=box,
            system_prompt=self.system_prompt,
            tools=[dict(s) for s in self._schemas],
            messages=self.first_messages(task),
        )


def _bound(fn: Callable[..., Any], state: Any) -> Callable[..., Any]:
    """`fn` with the state filled in, Enum arguments turned from values into members (the
    schema has already checked every value is one)."""
    enums = enum_arguments(fn)

    def call(**arguments: Any) -> Any:
        for name, kind in enums.items():
            if arguments.get(name) is not None:
                arguments[name] = kind(arguments[name])
        return fn(state, **arguments)

    return call


@dataclass
class KitEpisode(Generic[S]):
    env: TaskFileEnvironment[S]
    task: TaskSpec
    state: S
    box: ToolBox
    system_prompt: str
    tools: list[dict[str, Any]]
    messages: list[Message]
    transcript: list[Message] = field(default_factory=list)
    replies: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.transcript = list(self.messages)

    @property
    def calls(self) -> list[CallRecord]:
        return self.box.calls

    def step(self, assistant: Message) -> StepResult:
        self.transcript.append(assistant)
        if assistant.tool_calls:
            out = [self.box.call(call) for call in assistant.tool_calls]
        else:
            answer = self.env.user_reply(self.task, self.state, self.replies)
            self.replies += 1
            if answer is None:
                self.done = True
                return StepResult(messages=[], done=True)
            out = [Message(role="user", content=answer)]
        self.transcript.extend(out)
        return StepResult(messages=out, done=False)

    def score(self) -> Score:
        graded = self.env.reward(
            self.task, Transcript(self.state, list(self.transcript), list(self.box.calls))
        )
        if isinstance(graded, Score):
            reward, result = graded.reward, graded
        else:
            reward = float(graded)
            result = Score(reward=reward, success=reward >= 1.0, breakdown={"reward": reward})
        if not 0.0 <= reward <= 1.0:
            raise ValueError(
                f"{self.env.name}: reward {reward} for task {self.task.id!r} is not in [0, 1]"
            )
        return result
