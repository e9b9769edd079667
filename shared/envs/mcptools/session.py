"""One MCP client connection, owned by a task of its own: the SDK's context managers (anyio task
groups, the server's subprocess) must be entered and left in the same task, while an episode's
reset, steps and close arrive as separate awaits. Requests reach the owner through a queue."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from mcp import Client, StdioServerParameters
from mcp import types as mcp_types

from shared.errors import RetryableError
from shared.logging import get_logger

log = get_logger(__name__)
Server = StdioServerParameters | str | Any
"""What `mcp.Client` connects to: a command to start, a streamable-HTTP URL, or (in tests) a
server object in this process."""
_Request = tuple[str, dict[str, Any], "asyncio.Future[mcp_types.CallToolResult]"]


class McpSession:
    def __init__(self, server: Server, *, timeout_s: float) -> None:
        self.server = server
        self.timeout_s = timeout_s
        self.tools: list[mcp_types.Tool] = []
        self._queue: asyncio.Queue[_Request | None] = asyncio.Queue()
        self._ready: asyncio.Future[list[mcp_types.Tool]] | None = None
        self._owner: asyncio.Task[None] | None = None

    async def open(self) -> list[mcp_types.Tool]:
        """Connect, and list the server's tools; a server that will not start or answer is a
        RetryableError."""
        self._ready = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(), name="mcp-session")
        try:
            self.tools = await asyncio.wait_for(asyncio.shield(self._ready), self.timeout_s)
        except asyncio.CancelledError:
            await asyncio.shield(self.close())  # a cancelled reset leaves no server behind
            raise
        except (TimeoutError, Exception) as exc:
            await self.close()
            raise RetryableError(
                f"MCP server {self._label()} did not start: {_reason(exc)}"
            ) from exc
        return self.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        if self._owner is None or self._owner.done():
            raise RetryableError(f"MCP server {self._label()} is gone")
        answer: asyncio.Future[mcp_types.CallToolResult] = (
            asyncio.get_running_loop().create_future()
        )
        await self._queue.put((name, arguments, answer))
        try:
            return await asyncio.wait_for(asyncio.shield(answer), self.timeout_s)
        except TimeoutError as exc:
            raise RetryableError(
                f"MCP tool {name!r} did not answer within {self.timeout_s:.0f} s"
            ) from exc
        except Exception as exc:  # the connection broke (the SDK raises MCPError or a group)
            raise RetryableError(f"MCP tool {name!r} failed: {_reason(exc)}") from exc

    async def close(self) -> None:
        if self._owner is None:
            return
        await self._queue.put(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._owner), self.timeout_s)
        except (TimeoutError, Exception):  # noqa: BLE001  a server that will not stop is stopped
            self._owner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._owner
        self._owner = None

    async def _own(self) -> None:
        assert self._ready is not None
        pending: _Request | None = None
        try:
            async with Client(self.server) as client:
                self._ready.set_result((await client.list_tools()).tools)
                while (pending := await self._queue.get()) is not None:
                    name, arguments, answer = pending
                    try:
                        answer.set_result(await client.call_tool(name, arguments))
                    except Exception as exc:  # noqa: BLE001  handed to the caller, which names it
                        answer.set_exception(exc)
                    pending = None
        except Exception as exc:  # noqa: BLE001  SDK errors (ExceptionGroups) go to the callers
            if not self._ready.done():
                self._ready.set_exception(exc)
            if pending is not None and not pending[2].done():
                pending[2].set_exception(exc)
            while not self._queue.empty():
                queued = self._queue.get_nowait()
                if queued is not None and not queued[2].done():
                    queued[2].set_exception(exc)
            log.warning("MCP session ended", server=self._label(), error=_reason(exc))

    def _label(self) -> str:
        if isinstance(self.server, StdioServerParameters):
            return " ".join([self.server.command, *self.server.args])
        return self.server if isinstance(self.server, str) else type(self.server).__name__


def _reason(exc: BaseException) -> str:
    """The innermost cause of an error (anyio wraps them in ExceptionGroups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
