"""The toolbox's tools over one world, with a task's injected failures wired in.

A fault (`{"tool": "set_alarm", "times": 1, "error": "..."}`) makes the first `times` calls
of that tool that pass the schema fail with `error`, before touching the world: a transient
outage the agent must notice and retry through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shared.envs.toolbox.comms import comms_tools
from shared.envs.toolbox.device import device_tools
from shared.envs.toolbox.schedule import schedule_tools
from shared.envs.toolbox.world import World
from shared.envs.tools import Tool, ToolBox, ToolError

MUTATING = frozenset(
    {
        "add_contact",
        "update_contact",
        "send_message",
        "set_alarm",
        "delete_alarm",
        "add_reminder",
        "complete_reminder",
        "create_event",
        "delete_event",
        "set_setting",
        "create_note",
    }
)
"""Tools with a side effect on the world; the rest only read."""


def all_tools(world: World) -> list[Tool]:
    return [*comms_tools(world), *schedule_tools(world), *device_tools(world)]


def build_toolbox(world: World, faults: Sequence[dict[str, Any]] = ()) -> ToolBox:
    tools = {tool.name: tool for tool in all_tools(world)}
    for fault in faults:
        tool = tools[fault["tool"]]
        failing = _failing(tool.fn, int(fault.get("times", 1)), str(fault["error"]))
        tools[tool.name] = Tool(tool.name, tool.description, tool.parameters, failing)
    return ToolBox(tools)


def _failing(fn: Callable[..., Any], times: int, error: str) -> Callable[..., Any]:
    remaining = [times]

    def call(**kwargs: Any) -> Any:
        if remaining[0] > 0:
            remaining[0] -= 1
            raise ToolError(error)
        return fn(**kwargs)

    return call
