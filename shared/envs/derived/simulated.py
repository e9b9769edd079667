"""Derived environments for targets retrace cannot replay in a training step (HTTP, MCP).

`simulate` asks the target for each chosen task's opening once, at synthesis (the system
prompt, the exact tool schemas, the first messages) and keeps it in the spec. A
`SimulatedEpisode` then plays that opening locally: every tool call is checked against the
target's schema as `ToolBox` checks any call (unknown tool, bad JSON, schema violation), and
a valid one gets a simulated result drawn from the episode's seed: an acknowledgement that
echoes the arguments with a seeded reference, or, when the capability is recovering from tool
errors, a seeded transient refusal of a first call. Nothing is sent to the target's tools. The
reward is the capability check alone (the target's own reward needs its real tools), and every
score's notes say the tools were simulated.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import msgspec

from shared.envs.derived.checks import CHECKS
from shared.envs.derived.spec import DerivedSpec, SimulatedTask
from shared.envs.protocol import Environment, Message, Score, StepResult, TaskSpec, close, start
from shared.envs.tools import CallRecord, Tool, ToolBox, ToolError
from shared.errors import PermanentError

SIMULATED_NOTE = "tool results simulated: the target's tools were not called"
RECOVERY_CHECKS = {"recover_from_tool_errors", "avoid_repeating_rejected_calls"}
TRANSIENT_RATE = 0.5
"""Share of recovery episodes whose first valid call is refused once."""


def is_remote(env: Environment) -> bool:
    """Whether `env` starts its episodes asynchronously (an HTTP or MCP target)."""
    return getattr(env, "areset", None) is not None


async def simulate(spec: DerivedSpec, target: Environment, *, seed: int = 0) -> DerivedSpec:
    """`spec` with a snapshot of each of its tasks' opening, as `target` serves it with
    `seed`, and the reward left to the capability check. A spec without a check cannot be
    graded with simulated tools: `PermanentError`, naming the capability."""
    if spec.check is None:
        raise PermanentError(
            f"capability {spec.capability.name!r} has no check to grade it with, and "
            f"{spec.target!r} serves its tools remotely: no training environment can be derived"
        )
    known = {t.id: t for t in target.tasks()}
    snapshots = []
    for task_id in spec.task_ids:
        task = known.get(task_id)
        if task is None:
            raise PermanentError(f"target {spec.target!r} has no task {task_id!r}")
        episode = await start(target, task, seed)
        try:
            snapshots.append(
                SimulatedTask(
                    task_id=task.id,
                    kind=task.kind,
                    system_prompt=episode.system_prompt,
                    tools=list(episode.tools),
                    messages=list(episode.messages),
                )
            )
        finally:
            await close(episode)
    return msgspec.structs.replace(spec, simulated=snapshots, check_weight=1.0)


class SimulatedEpisode:
    def __init__(self, spec: DerivedSpec, task: TaskSpec, opening: SimulatedTask, seed: int):
        assert spec.check is not None  # decode_derived refuses a simulated spec without one
        self.spec = spec
        self.hint = str(task.data.get("hint", ""))
        """Guidance for hinted rollouts (shared/envs/guidance.py)."""
        self.system_prompt = opening.system_prompt
        self.tools = [dict(t) for t in opening.tools]
        self.messages = list(opening.messages)
        self.turns: list[Message] = []
        digest = hashlib.sha256(f"simulated:{task.id}:{seed}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))
        self._refusals = (
            1 if spec.check in RECOVERY_CHECKS and self._rng.random() < TRANSIENT_RATE else 0
        )
        self.box = ToolBox({tool.name: tool for tool in _tools(self.tools, self._result)})

    @property
    def calls(self) -> list[CallRecord]:
        return self.box.calls

    def _result(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self._refusals:
            self._refusals -= 1
            raise ToolError(f"{name} is temporarily unavailable; try the same call again")
        return {
            "status": "ok",
            "tool": name,
            "arguments": arguments,
            "reference": f"{name[:3].upper()}-{self._rng.randrange(10_000, 100_000)}",
            "simulated": True,
        }

    def step(self, assistant: Message) -> StepResult:
        self.turns.append(assistant)
        if not assistant.tool_calls:
            return StepResult(messages=[], done=True)
        out = [self.box.call(call) for call in assistant.tool_calls]
        self.turns.extend(out)
        return StepResult(messages=out, done=False)

    def score(self) -> Score:
        check = self.spec.check
        assert check is not None
        exercised = CHECKS[check](self.turns, self.calls)
        return Score(
            reward=round(exercised, 6),
            success=exercised >= 1.0,
            breakdown={f"capability:{check}": exercised},
            notes=[f"{check}: {exercised:.2f}", SIMULATED_NOTE],
        )


def _tools(schemas: list[dict[str, Any]], result: Any) -> list[Tool]:
    """The target's tool schemas, each answered by `result(name, arguments)`."""
    tools = []
    for schema in schemas:
        function = schema.get("function") or {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            continue
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append(
            Tool(name, str(function.get("description", "")), parameters, _answer(name, result))
        )
    return tools


def _answer(name: str, result: Any) -> Any:
    def call(**arguments: Any) -> Any:
        return result(name, arguments)

    return call
