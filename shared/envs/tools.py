"""Tools with OpenAI schemas, and the one place tool calls are checked and run.

`ToolBox.call` turns anything the model produced into a tool message: unknown tool, JSON that
does not parse, arguments that break the schema, or a tool that raises `ToolError`, each with
an error text the agent can act on. Nothing an agent sends can raise out of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from shared.envs.protocol import Message, ToolCall


class ToolError(Exception):
    """Raised by a tool implementation: the message goes back to the agent as the result."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class CallRecord:
    """What happened to one tool call, for scoring and for contrast's features."""

    name: str
    arguments: dict[str, Any] | None
    ok: bool
    error: str | None
    result: Any = None


@dataclass
class ToolBox:
    tools: dict[str, Tool]
    calls: list[CallRecord] = field(default_factory=list)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def call(self, call: ToolCall) -> Message:
        name = call.function.name
        result: Any
        tool = self.tools.get(name)
        if tool is None:
            return self._error(
                call, name, None, f"unknown tool {name!r}; available: {', '.join(self.tools)}"
            )
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as exc:
            return self._error(call, name, None, f"arguments are not valid JSON: {exc.msg}")
        except RecursionError:
            return self._error(call, name, None, "arguments are not valid JSON: nested too deeply")
        if not isinstance(args, dict):
            return self._error(call, name, None, "arguments must be a JSON object")
        problem = _schema_error(tool.parameters, args)
        if problem:
            return self._error(call, name, args, f"invalid arguments: {problem}")
        try:
            result = tool.fn(**args)
        except ToolError as exc:
            return self._error(call, name, args, str(exc))
        self.calls.append(CallRecord(name, args, True, None, result))
        return Message(
            role="tool",
            tool_call_id=call.id,
            name=name,
            content=json.dumps(result, sort_keys=True, default=str),
        )

    def _error(self, call: ToolCall, name: str, args: dict[str, Any] | None, text: str) -> Message:
        self.calls.append(CallRecord(name, args, False, text))
        return Message(
            role="tool", tool_call_id=call.id, name=name, content=json.dumps({"error": text})
        )


def _schema_error(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
    if not errors:
        return None
    first = errors[0]
    where = ".".join(str(p) for p in first.path) or "arguments"
    return f"{where}: {first.message}"
