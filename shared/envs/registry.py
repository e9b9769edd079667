"""Environments by reference: `toolbox`, `helpdesk` (built in). Unknown names are a clear error."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from shared.envs.protocol import Environment
from shared.errors import PermanentError


class UnknownEnvironmentError(PermanentError):
    """No environment of that name."""


def _toolbox() -> Environment:
    from shared.envs.toolbox import ToolboxEnvironment

    return ToolboxEnvironment()


def _helpdesk() -> Environment:
    from shared.envs.helpdesk import HelpdeskEnvironment

    return HelpdeskEnvironment()


BUILTIN: dict[str, Callable[[], Environment]] = {"toolbox": _toolbox, "helpdesk": _helpdesk}


@cache
def get_environment(ref: str) -> Environment:
    """The environment named by `ref`; built once per process (task generation is not free)."""
    factory = BUILTIN.get(ref)
    if factory is None:
        raise UnknownEnvironmentError(
            f"unknown environment {ref!r}; built in: {', '.join(sorted(BUILTIN))}"
        )
    return factory()
