"""`McpEnvironment`: tasks and checks from the user's files, tools from an MCP server.

Every episode opens its own MCP session; with a `command` server that is a fresh server process,
so no episode sees another's side effects (a `url` server is shared: its state is the user's
business). The server's tools become OpenAI tool schemas verbatim (name, description, input
schema); each tool call the agent makes is sent to the server, and the answer comes back as the
tool message: the result's text, or `{"error": ...}` when the server says the call failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters
from mcp import types as mcp_types

from shared.envs.kit.tasks import read_tasks
from shared.envs.mcptools.judge import judged
from shared.envs.mcptools.session import McpSession, Server
from shared.envs.mcptools.spec import Check, McpEnvSpec, McpSpecError, checks, load_spec
from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.envs.tools import CallRecord
from shared.errors import PermanentError

PREFIX = "mcp:"


def is_mcp_ref(ref: str) -> bool:
    return ref.startswith(PREFIX)


class McpEnvironment:
    def __init__(self, spec: McpEnvSpec, base: Path, *, name: str, server: Server = None) -> None:
        self.name = name
        self.spec = spec
        self.server: Server = server if server is not None else _server(spec, base)
        self._tasks = read_tasks(base / spec.tasks)
        for task in self._tasks:
            parsed = checks(task)  # every task's checks parse now, not in a rollout
            if spec.judge is None and any(c.kind == "judge" for c in parsed):
                raise McpSpecError(
                    f"MCP environment {name}: task {task.id!r} has a 'judge' check, and the "
                    "environment file names no judge (add `judge: {model: <model name>}`)"
                )

    @classmethod
    def from_ref(cls, ref: str) -> McpEnvironment:
        """`mcp:<path to the environment's YAML file>`."""
        path = Path(ref.removeprefix(PREFIX)).expanduser()
        spec, base = load_spec(path)
        return cls(spec, base, name=ref)

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> McpEpisode:
        raise PermanentError(f"environment {self.name} serves its tools over MCP: use areset")

    async def areset(self, task: TaskSpec, seed: int) -> McpEpisode:
        prompt = task.data.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise PermanentError(f"task {task.id!r} of {self.name} has no 'prompt' text")
        session = McpSession(self.server, timeout_s=self.spec.call_timeout_s)
        tools = await session.open()
        return McpEpisode(self, task, session, tools, prompt)


class McpEpisode:
    def __init__(
        self,
        env: McpEnvironment,
        task: TaskSpec,
        session: McpSession,
        tools: list[mcp_types.Tool],
        prompt: str,
    ) -> None:
        self.env = env
        self.task = task
        self.session = session
        self.system_prompt = env.spec.system_prompt
        self.tools = [_schema(tool) for tool in tools]
        self.messages = [Message(role="user", content=prompt)]
        self.calls: list[CallRecord] = []
        self.replies = 0
        self.last_reply = ""
        self._known = {tool.name for tool in tools}

    async def astep(self, assistant: Message) -> StepResult:
        if assistant.content:
            self.last_reply = assistant.content
        if not assistant.tool_calls:
            replies = self.task.data.get("replies") or []
            if self.replies < len(replies):
                self.replies += 1
                return StepResult(
                    messages=[Message(role="user", content=str(replies[self.replies - 1]))],
                    done=False,
                )
            return StepResult(messages=[], done=True)
        out = []
        for call in assistant.tool_calls:
            text = await self._call(call.function.name, call.function.arguments)
            out.append(
                Message(role="tool", tool_call_id=call.id, name=call.function.name, content=text)
            )
        return StepResult(messages=out, done=False)

    async def _call(self, name: str, raw: str) -> str:
        if name not in self._known:
            return self._refuse(
                name, None, f"unknown tool {name!r}; available: {', '.join(sorted(self._known))}"
            )
        try:
            arguments = json.loads(raw or "{}")
        except (json.JSONDecodeError, RecursionError):
            return self._refuse(name, None, "arguments are not valid JSON")
        if not isinstance(arguments, dict):
            return self._refuse(name, None, "arguments must be a JSON object")
        result = await self.session.call(name, arguments)
        text = _text(result)[: self.env.spec.result_chars]
        if result.is_error:
            return self._refuse(name, arguments, text or "the tool failed")
        self.calls.append(CallRecord(name, arguments, True, None, text))
        return text

    def _refuse(self, name: str, arguments: dict[str, Any] | None, why: str) -> str:
        self.calls.append(CallRecord(name, arguments, False, why))
        return json.dumps({"error": why})

    async def ascore(self) -> Score:
        parts: dict[str, float] = {}
        notes: list[str] = []
        total = passed = 0.0
        for index, check in enumerate(checks(self.task)):
            if check.kind == "judge":
                assert self.env.spec.judge is not None  # refused when the environment loads
                verdict = await judged(
                    self.env.spec.judge,
                    check.text or "",
                    str(self.task.data.get("prompt", "")),
                    self.calls,
                    self.last_reply,
                )
                ok = verdict.passed
                notes.append(f"judge on {check.text!r}: {verdict.reason}")
            else:
                ok = _passed(check, self.calls, self.last_reply)
            total += check.weight
            passed += check.weight if ok else 0.0
            label = f"{index}:{check.kind}" + (f":{check.tool}" if check.tool else "")
            parts[label] = check.weight if ok else 0.0
            if not ok:
                notes.append(f"failed {label}")
        reward = passed / total
        return Score(reward=reward, success=passed == total, breakdown=parts, notes=notes)

    async def aclose(self) -> None:
        await self.session.close()

    def step(self, assistant: Message) -> StepResult:
        raise PermanentError("an MCP episode is stepped with astep")

    def score(self) -> Score:
        raise PermanentError("an MCP episode is scored with ascore")


def _passed(check: Check, calls: list[CallRecord], reply: str) -> bool:
    ok_calls = [c for c in calls if c.ok and c.name == check.tool]
    if check.kind == "called":
        return any(_has(c.arguments or {}, check.arguments) for c in ok_calls)
    if check.kind == "not_called":
        return not any(c.name == check.tool for c in calls)
    if check.kind == "result_contains":
        return any((check.text or "").lower() in str(c.result).lower() for c in ok_calls)
    return bool(calls) and (check.text or "").lower() in reply.lower()


def _has(arguments: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Every wanted argument is there with that value (strings compared case-insensitively)."""
    for key, value in wanted.items():
        got = arguments.get(key)
        if isinstance(value, str) and isinstance(got, str):
            if " ".join(value.lower().split()) != " ".join(got.lower().split()):
                return False
        elif got != value:
            return False
    return True


def _schema(tool: mcp_types.Tool) -> dict[str, Any]:
    parameters = dict(tool.input_schema or {"type": "object", "properties": {}})
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": parameters,
        },
    }


def _text(result: mcp_types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, sort_keys=True, default=str)
    return ""


def _server(spec: McpEnvSpec, base: Path) -> Server:
    if spec.server.url is not None:
        return spec.server.url
    assert spec.server.command is not None
    # `python` is the interpreter running retrace (a virtualenv's is rarely first on PATH)
    command = sys.executable if spec.server.command == "python" else spec.server.command
    return StdioServerParameters(
        command=command,
        args=spec.server.args,
        env=spec.server.env,
        cwd=str(base / spec.server.cwd) if spec.server.cwd else str(base),
    )
