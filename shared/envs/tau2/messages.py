"""Between retrace's messages and tau2's: tool-call arguments checked, tool results mapped."""

from __future__ import annotations

import json
from typing import Any

from shared.envs.protocol import Message, ToolCall


def parse_arguments(text: str) -> dict[str, Any] | str:
    """The call's arguments as a dict, or why they are not one (the error the agent sees)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"Error: the arguments are not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"Error: the arguments must be a JSON object, got {type(value).__name__}"
    return value


def tool_message(call: ToolCall, content: str) -> Message:
    """The tool message answering `call`, as the agent sees it."""
    return Message(role="tool", content=content, tool_call_id=call.id, name=call.function.name)


def content_text(message: Any) -> str:
    """A tau2 message's text ('' for none)."""
    return str(message.content) if message.content is not None else ""
