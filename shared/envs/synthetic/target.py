"""The target a synthetic environment reuses: the toolbox's tool schemas and implementations.

`toolbox_schemas()` is what specs are validated against; `offered_toolbox` builds the real
toolbox tools over a generated world (injected faults wired in) and keeps only the offered
ones, so an agent sees exactly the target's schemas and the target's behaviour.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from functools import cache
from typing import Any

from shared.envs.toolbox.builder import START
from shared.envs.toolbox.tools import all_tools, build_toolbox
from shared.envs.toolbox.world import World
from shared.envs.tools import ToolBox

TARGETS = ("toolbox",)
"""Targets whose tools a spec may reuse."""


@cache
def _schemas() -> tuple[dict[str, Any], ...]:
    # schemas do not depend on the world's contents, so an empty world lists them
    return tuple(tool.schema() for tool in all_tools(World(now=START, rng=random.Random(0))))


def toolbox_schemas() -> list[dict[str, Any]]:
    """The toolbox's OpenAI tool schemas, in the toolbox's order (fresh copies)."""
    return copy.deepcopy(list(_schemas()))


def schema_of(name: str) -> dict[str, Any]:
    """The toolbox schema of one tool (a `KeyError` for an unknown name)."""
    for schema in toolbox_schemas():
        if schema["function"]["name"] == name:
            return schema
    raise KeyError(name)


def tool_order() -> list[str]:
    return [schema["function"]["name"] for schema in _schemas()]


def offered_toolbox(
    world: World, offered: Sequence[str], faults: Sequence[dict[str, Any]] = ()
) -> ToolBox:
    """The target's tools over `world`, only those named in `offered`, in that order."""
    every = build_toolbox(world, faults).tools
    return ToolBox({name: every[name] for name in offered})
