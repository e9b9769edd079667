"""The environment protocol every target and synthetic environment implements.

An environment lists its tasks (each with a fixed train/test split) and starts seeded,
deterministic episodes. An episode gives the system prompt, the tools (OpenAI function
schemas) and the first messages; `step` takes one assistant message and answers with tool
results or the user's reply; `score` grades the episode in [0, 1] with a breakdown.

A bad action is data, not a crash: malformed tool calls, unknown tools, bad arguments and tool
failures come back to the agent as tool messages, exactly as a real tool would answer.

An environment whose reset, step or scoring blocks (a simulated user behind a model endpoint, an
evaluator that reloads a database) may also define `async def areset(task, seed)` and, on its
episodes, `async def astep(assistant)` and `async def ascore()`; asyncio callers go through
`start`, `advance` and `grade`, which use them when present. An episode holding resources (a
tool server's process or connection) may define `async def aclose()`: `close` calls it once
the episode is over, however it ended.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast

import msgspec

Role = Literal["system", "user", "assistant", "tool"]
Split = Literal["train", "test"]


class ToolCallFunction(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    arguments: str
    """JSON text, as the OpenAI API sends it (it may be malformed: the environment checks)."""


class ToolCall(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    function: ToolCallFunction
    type: Literal["function"] = "function"


class Message(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One chat message in OpenAI's shape."""

    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class TaskSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A task as stored in Postgres: enough to rebuild its episode deterministically."""

    id: str
    """Stable within its environment, e.g. `single-0042`."""
    kind: str
    split: Split
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class Score(msgspec.Struct, kw_only=True, frozen=True):
    reward: float
    """In [0, 1]."""
    success: bool
    breakdown: dict[str, float] = msgspec.field(default_factory=dict)
    """Each check's contribution (milestones, forbidden actions, communication...)."""
    notes: list[str] = msgspec.field(default_factory=list)
    """Human-readable reasons, e.g. which milestone was missed."""


class StepResult(msgspec.Struct, kw_only=True, frozen=True):
    messages: list[Message]
    """Tool results and/or the user's reply, in order."""
    done: bool


class Episode(Protocol):
    system_prompt: str
    tools: list[dict[str, Any]]
    """OpenAI tool schemas: `{"type": "function", "function": {name, description, parameters}}`."""
    messages: list[Message]
    """The opening messages (usually the user's request)."""

    def step(self, assistant: Message) -> StepResult: ...

    def score(self) -> Score:
        """Grade the episode as it stands (callable at any time, e.g. after a turn limit)."""
        ...


class Environment(Protocol):
    name: str

    def tasks(self) -> list[TaskSpec]:
        """Every task, each with its fixed split; the same list on every call."""
        ...

    def reset(self, task: TaskSpec, seed: int) -> Episode:
        """A fresh episode of `task`; the same (task, seed) gives the same episode."""
        ...


async def start(env: Environment, task: TaskSpec, seed: int) -> Episode:
    """`env.reset(task, seed)`, awaiting the environment's `areset` when it has one."""
    areset = getattr(env, "areset", None)
    if areset is not None:
        return cast(Episode, await areset(task, seed))
    return env.reset(task, seed)


async def advance(episode: Episode, assistant: Message) -> StepResult:
    """`episode.step(assistant)`, awaiting the episode's `astep` when it has one."""
    astep = getattr(episode, "astep", None)
    if astep is not None:
        return cast(StepResult, await astep(assistant))
    return episode.step(assistant)


async def grade(episode: Episode) -> Score:
    """`episode.score()`, awaiting the episode's `ascore` when it has one."""
    ascore = getattr(episode, "ascore", None)
    if ascore is not None:
        return cast(Score, await ascore())
    return episode.score()


async def close(episode: Episode) -> None:
    """Release what the episode holds (its `aclose`, when it has one)."""
    aclose = getattr(episode, "aclose", None)
    if aclose is not None:
        await aclose()
