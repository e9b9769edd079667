"""Reference solutions: the assistant messages (OpenAI shape, JSON-able) that solve a task."""

from __future__ import annotations

import json
from typing import Any


class Script:
    """Assistant messages in order: texts to the user and single tool calls."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        """The write calls made, as `{name, arguments}`: the task's expected actions."""

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def call(self, name: str, **arguments: Any) -> None:
        call_id = f"call_{len(self.messages)}"
        function = {"name": name, "arguments": json.dumps(arguments)}
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )

    def write(self, name: str, **arguments: Any) -> None:
        self.call(name, **arguments)
        self.writes.append({"name": name, "arguments": arguments})
