"""A planted target where training must help: a codebook desk whose one tool, `lookup_code`,
knows what each code means, and whose system prompt shows the exact call to write. An episode
succeeds only when the agent looked its code up, so success *is* the capability
`use_tools_when_needed`; SmolLM2 copies the call on a minority of its samples, which gives
contrast both successes and failures to compare and GRPO groups with reward variance.

Served over the HTTP environment protocol (`shared.envs.remote.server.environment_app`) by the
full-chain e2e test; a real environment like any built-in, not a fake of one.
"""

from __future__ import annotations

import json
import random
from typing import Any

from shared.envs.protocol import Message, Score, StepResult, TaskSpec, ToolCall, ToolCallFunction
from shared.envs.tools import Tool, ToolBox

SYSTEM_PROMPT = (
    "You answer questions about codes. You do not know what any code means: only the tool "
    "lookup_code does. Always call it first, writing exactly\n"
    '<tool_call>{"name": "lookup_code", "arguments": {"code": "THE CODE"}}</tool_call>\n'
    "then tell the user what the code means."
)
WORDS = (
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
    "juniper", "krypton", "lagoon", "meadow", "nickel", "orchid", "pepper", "quartz", "river",
)  # fmt: skip


EXAMPLE = (
    Message(role="user", content="What does code A10 mean?"),
    Message(
        role="assistant",
        tool_calls=[
            ToolCall(
                id="example-0",
                function=ToolCallFunction(name="lookup_code", arguments='{"code": "A10"}'),
            )
        ],
    ),
    Message(
        role="tool",
        tool_call_id="example-0",
        name="lookup_code",
        content='{"code": "A10", "meaning": "amber"}',
    ),
    Message(role="assistant", content="Code A10 means amber."),
)
"""A worked exchange before the task's question: SmolLM2 copies the call only with one."""


class CodebookEpisode:
    system_prompt = SYSTEM_PROMPT

    def __init__(self, task: TaskSpec, seed: int) -> None:
        self.task = task
        meaning = random.Random(f"codebook:{task.id}:{seed}").choice(WORDS)
        self.box = ToolBox(
            {
                "lookup_code": Tool(
                    name="lookup_code",
                    description="What a code means.",
                    parameters={
                        "type": "object",
                        "properties": {"code": {"type": "string", "description": "The code."}},
                        "required": ["code"],
                        "additionalProperties": False,
                    },
                    fn=lambda code: {"code": code, "meaning": meaning},
                )
            }
        )
        self.tools: list[dict[str, Any]] = self.box.schemas()
        self.messages = [
            *EXAMPLE,
            Message(role="user", content=f"What does code {task.data['code']} mean?"),
        ]
        self.replies = 0

    @property
    def calls(self) -> list[Any]:
        return self.box.calls

    def step(self, assistant: Message) -> StepResult:
        if assistant.tool_calls:
            return StepResult(messages=[self.box.call(c) for c in assistant.tool_calls], done=False)
        return StepResult(messages=[], done=True)  # an answer in words ends the episode

    def score(self) -> Score:
        looked_up = any(
            c.ok
            and str((c.arguments or {}).get("code", "")).strip().upper() == self.task.data["code"]
            for c in self.box.calls
        )
        called = any(c.ok for c in self.box.calls)
        reward = 1.0 if looked_up else 0.5 if called else 0.0
        return Score(
            reward=reward,
            success=looked_up,
            breakdown={"looked_up": float(looked_up), "called": float(called)},
            notes=[] if looked_up else [f"never looked up {self.task.data['code']}"],
        )


class CodebookEnvironment:
    name = "codebook"

    def __init__(self, tasks: int = 64) -> None:
        rng = random.Random(7)
        codes = [
            f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randrange(10, 99)}" for _ in range(tasks)
        ]
        self._tasks = [
            TaskSpec(
                id=f"code-{i:03d}",
                kind="lookup",
                split="test" if i % 2 else "train",
                data={"code": code, "reference": _reference(code)},
            )
            for i, code in enumerate(codes)
        ]

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> CodebookEpisode:
        return CodebookEpisode(task, seed)


def _reference(code: str) -> list[dict[str, Any]]:
    """The solution: look the code up, then answer. When the agent succeeds too rarely,
    contrast compares its failures with these replayed (`RETRACE_CONTRAST_MIN_SUCCESSES`)."""
    call = {"name": "lookup_code", "arguments": json.dumps({"code": code})}
    return [
        {
            "role": "assistant",
            "tool_calls": [{"id": "ref-0", "type": "function", "function": call}],
        },
        {"role": "assistant", "content": f"I looked code {code} up for you."},
    ]
