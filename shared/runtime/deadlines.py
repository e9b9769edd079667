"""Time limits on what an HTTP client sends. A connection that holds no whole request (idle
between requests, or its headers still arriving) is closed after the idle timeout (aiohttp's
keep-alive timer, which starts when the connection opens); a request's body must arrive
within the body timeout (408 after). Without them, clients that open connections and send
nothing, or a byte at a time, hold the server's sockets and handlers for as long as they
like (issue 14: 200 half-open connections held the model server past 60 s). And a stream's
piece must be taken by its caller within a write timeout (`write_within`): one who stopped
reading held its stream, and what stood behind it, for ever."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestPayloadError

IDLE_TIMEOUT_S = 30.0
"""Default: far longer than a client on a working network takes to send its headers, and
longer than the clients' own keep-alive (aiohttp 15 s, httpx and the OpenAI SDK 5 s), so a
client closes an idle connection before the server does and never sends a request on one
the server is closing."""
BODY_TIMEOUT_S = 30.0
"""Default: a 4 MiB body at about 140 KB/s, the slowest client still served."""
WRITE_TIMEOUT_S = 30.0
"""Default: how long a stream's write waits for its caller to read."""


class CallerStalled(Exception):
    """The caller took nothing of a stream within the write timeout (its connection is
    aborted)."""


async def read_body(request: web.Request, seconds: float) -> bytes:
    """The request's body (aiohttp keeps it for later reads), or a 408 when it has not
    arrived whole within `seconds`; too large a body is aiohttp's 413 as before."""
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {seconds:g} s"
        ) from None
    except (HttpProcessingError, RequestPayloadError) as exc:  # not gzip, a broken chunk
        raise web.HTTPBadRequest(
            text=f"the request body could not be read: {str(exc)[:200]}"
        ) from None


def body_deadline(seconds: float) -> Middleware:
    """Middleware: a request's body read whole within `seconds` (else the 408 of
    `read_body`) before its handler runs, for apps whose handlers read bodies themselves
    (aiohttp keeps the bytes, so their own reads return at once)."""

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            await read_body(request, seconds)
        return await handler(request)

    return deadline


async def write_within(
    request: web.Request, out: web.StreamResponse, chunk: bytes, seconds: float
) -> None:
    """A piece of a stream written to the caller; a caller who does not take it within
    `seconds` is cut off (`CallerStalled`, the connection aborted). A write waits only when
    what the caller has not read yet passes the socket's limit: below its low mark no timer
    is armed (one a piece cost the router's relay as much again as the write)."""
    if _room(request, len(chunk)):
        await out.write(chunk)
        return
    await _within(request, out.write(chunk), seconds)


async def end_within(request: web.Request, out: web.StreamResponse, seconds: float) -> None:
    """A stream's end written (`write_eof`), within `seconds` of waiting for the caller to
    take what it has not read yet; else `CallerStalled`, the connection aborted. aiohttp
    waits on the socket only once tens of KiB were written since its last wait, so a write
    can return with the socket full: an end without a limit then waited for ever on a caller
    who stopped reading in a stream's last stretch (session 33's review)."""
    if _room(request, 0):
        await out.write_eof()
        return
    await _within(request, out.write_eof(), seconds)


def _room(request: web.Request, adding: int) -> bool:
    """Whether `adding` more bytes leave what the caller has not read yet under its socket's
    low mark (no wait possible; no socket: nothing to wait for)."""
    transport = request.transport
    if transport is None:
        return True
    return transport.get_write_buffer_size() + adding <= transport.get_write_buffer_limits()[0]


async def _within(request: web.Request, write: Awaitable[None], seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await write
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise CallerStalled from None
