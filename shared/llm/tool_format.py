"""The tool-call text format: render a conversation with the tool-aware template, and parse
what the model wrote back into OpenAI tool calls.

Parsing never guesses: a `<tool_call>` block that is not a JSON object with a string `name`
and an object `arguments` is reported as malformed, with the reason and its raw text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.S)


@cache
def tool_template() -> str:
    """The Jinja chat template shipped with retrace (also usable as vLLM's --chat-template)."""
    return resources.files("shared.llm").joinpath("templates/tool_chatml.jinja").read_text()


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """Canonical JSON text of the arguments object."""


@dataclass(frozen=True)
class MalformedCall:
    raw: str
    error: str
    name: str | None = None
    """The function name, when one could still be read."""


@dataclass
class ParsedReply:
    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)
    malformed: list[MalformedCall] = field(default_factory=list)


def parse_reply(text: str) -> ParsedReply:
    """Split model output into free text and tool calls (well-formed and malformed)."""
    calls: list[ParsedCall] = []
    malformed: list[MalformedCall] = []
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        closed = match.group(0).endswith(CLOSE)
        result = _parse_call(body)
        if isinstance(result, ParsedCall) and closed:
            calls.append(result)
        elif isinstance(result, ParsedCall):
            malformed.append(MalformedCall(body, f"unterminated {OPEN} block", result.name))
        else:
            malformed.append(result)
    content = _BLOCK.sub("", text).strip() if calls else text.strip()
    if malformed and calls:
        # Keep the text of the broken blocks visible beside the calls that did parse.
        content = "\n".join(filter(None, [content, *(OPEN + m.raw for m in malformed)]))
    return ParsedReply(content or None, calls, malformed)


def _parse_call(body: str) -> ParsedCall | MalformedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return MalformedCall(
            body, f"not valid JSON: {exc.msg} at position {exc.pos}", _guess_name(body)
        )
    if not isinstance(obj, dict):
        return MalformedCall(body, "a tool call must be a JSON object with name and arguments")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(body, "missing a string 'name'")
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return MalformedCall(body, "'arguments' is a string that is not JSON", name)
    if not isinstance(args, dict):
        return MalformedCall(body, "'arguments' must be a JSON object", name)
    return ParsedCall(name, json.dumps(args, ensure_ascii=False))


def _guess_name(body: str) -> str | None:
    found = re.search(r'"name"\s*:\s*"([^"]+)"', body)
    return found.group(1) if found else None
