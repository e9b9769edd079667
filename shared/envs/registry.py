"""Environments by reference: `toolbox`, `helpdesk` (built in), tau2-bench's domains
`tau2:airline`, `tau2:retail`, `tau2:telecom` (the `tau2` extra), and every environment an
installed package declares under the `retrace.environments` entry points (`shared.envs.plugins`),
any base URL `http(s)://...` serving the HTTP environment protocol (`shared.envs.remote`), and
`mcp:<file>`, tools from an MCP server with tasks and checks from the user's files
(`shared.envs.mcptools`).
Unknown names are a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from pathlib import Path

from shared.envs import plugins
from shared.envs.conformance import BrokenEnvironmentError
from shared.envs.protocol import Environment
from shared.envs.remote.client import HttpEnvironment, is_http_ref
from shared.errors import PermanentError


class UnknownEnvironmentError(PermanentError):
    """No environment of that name."""


def _toolbox() -> Environment:
    from shared.envs.toolbox import ToolboxEnvironment

    return ToolboxEnvironment()


def _helpdesk() -> Environment:
    from shared.envs.helpdesk import HelpdeskEnvironment

    return HelpdeskEnvironment()


def _tau2(domain: str) -> Callable[[], Environment]:
    def build() -> Environment:
        # tau2 is an optional extra: nothing imports it before one of its environments is asked
        # for, and without it `require` raises an UnknownEnvironmentError naming the extra.
        from shared.envs.tau2.library import require

        require()
        from shared.envs.tau2.config import load_tau2_config
        from shared.envs.tau2.env import Tau2Environment

        return Tau2Environment(domain, load_tau2_config())

    return build


BUILTIN: dict[str, Callable[[], Environment]] = {
    "toolbox": _toolbox,
    "helpdesk": _helpdesk,
    "tau2:airline": _tau2("airline"),
    "tau2:retail": _tau2("retail"),
    "tau2:telecom": _tau2("telecom"),
}


@cache
def get_environment(ref: str) -> Environment:
    """The environment named by `ref`; built once per process (task generation is not free)."""
    factory = BUILTIN.get(ref)
    if factory is not None:
        return factory()
    if is_http_ref(ref):
        return HttpEnvironment(ref)
    if ref.startswith("mcp:"):
        return _mcp(ref)
    found = plugins.installed()
    point = found.get(ref)
    if point is None:
        raise UnknownEnvironmentError(
            f"unknown environment {ref!r}; built in: {', '.join(sorted(BUILTIN))}; "
            + (
                f"installed: {', '.join(sorted(found))}"
                if found
                else f"no package installs one (entry points {plugins.GROUP!r})"
            )
        )
    return plugins.load(point)


def _mcp(ref: str) -> Environment:
    try:
        from shared.envs.mcptools.env import McpEnvironment
    except ImportError as exc:
        raise UnknownEnvironmentError(
            f"environment {ref!r} serves its tools over MCP, which needs the `mcp` package: "
            "pip install 'retrace[mcp]'"
        ) from exc
    return McpEnvironment.from_ref(ref)


def canonical(ref: str) -> str:
    """The reference as services must store it: an `mcp:` file as an absolute path (a relative
    one would resolve against each reader's own working directory, and one file spelled two
    ways would be two environments)."""
    if ref.startswith("mcp:"):
        return "mcp:" + str(Path(ref.removeprefix("mcp:")).expanduser().resolve())
    return ref


async def open_environment(ref: str) -> Environment:
    """`get_environment` from asyncio code: building one may block (a plug-in's task file, an
    HTTP environment's task list), so it runs off the event loop."""
    return await asyncio.to_thread(get_environment, ref)


def available() -> dict[str, str]:
    """Every environment that can be named, with where it comes from (`built in`, or the
    package that installs it). Plug-ins reusing a built-in name are refused when listed."""
    out = {name: "built in" for name in BUILTIN}
    for name, point in plugins.installed().items():
        if name in out:
            raise BrokenEnvironmentError(
                f"{plugins.origin(point)} declares environment {name!r}, a built-in name; rename it"
            )
        out[name] = plugins.origin(point)
    return out
