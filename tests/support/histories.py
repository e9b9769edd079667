"""A chat history in which the assistant has called a tool: what a model is shown of its own
past calls (tests of prompt rendering, on `serve-model` and on vLLM)."""

from __future__ import annotations

from typing import Any

TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {"type": "object", "properties": {"room": {"type": "integer"}}},
    },
}


def after_a_call(arguments: str) -> dict[str, Any]:
    """A request's messages and tools: the user asks, the assistant calls `book` with
    `arguments` (JSON text, as the OpenAI API carries it), the tool answers."""
    call = {"id": "c1", "type": "function", "function": {"name": "book", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "book room 12"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "booked"},
        ],
        "tools": [TOOL],
    }
