"""The router's connections to the model server: HTTP/1.1 with keep-alive, one pool per
upstream, each reply parsed by llhttp (httptools).

Every chat request the router relays is one POST of bytes the router already holds, and
one reply, read whole or passed on as it comes. A pass-through proxy with aiohttp's client
took 0.57 to 0.59 ms of CPU a request on a 2-core machine, with this pool 0.30 to 0.32
(`benchmarks/relay_client.py`, docs/benchmarks.md, session 21). This is the part of a
client the relay needs, and no more: no redirects, cookies, proxies or decompression (the
model server sends none of them), the service key and `Host` encoded once.

A connection found idle in the pool may have been closed by the server a moment before it
was used (vLLM closes idle ones after 5 s): a request it fails before a byte of the reply
came is sent once more on a new connection (the server never read it). Any other failure
is an `UpstreamError`; the time limit, a `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import cast
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20
"""Bytes of a reply held unread before the connection stops reading (a slow caller of a
streamed reply slows the model server's socket, not the router's memory)."""
LOW_WATER = HIGH_WATER // 4


class UpstreamError(Exception):
    """The model server could not be reached, or broke off or garbled its reply."""


class UpstreamBusyError(UpstreamError):
    """Every connection to the model server stayed in use for the request's time limit."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time, its reply parsed as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.busy = False
        self.status = 0
        self.head = False
        """The reply's status line and headers have been read."""
        self.complete = False
        self.keep_alive = False
        self.received = 0
        """Bytes of the current reply received (0: the server has not begun to answer)."""
        self.error: UpstreamError | None = None
        self._framed = False
        """The reply says where its body ends (a length or chunks), not the connection's close."""
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self._whole = False
        """The reply is read whole (`whole`), not as it comes."""

    def begin(self, request: bytes, deadline: float | None) -> None:
        """Send a request; its reply's state starts afresh, and must end by `deadline` (the
        loop's clock; None: no limit)."""
        assert self.transport is not None
        self.busy, self.status, self.head, self.complete = True, 0, False, False
        self.keep_alive, self.received, self.error, self._framed = False, 0, None, False
        self.timed_out = self._whole = False
        self._body.clear()
        self._buffered = 0
        if deadline is not None:  # one timer a request (a timeout a wait cost a tenth more)
            self._timer = self._loop.call_at(deadline, self._expire)
        self.transport.write(request)

    def end(self) -> None:
        """The request is done with (its reply read, or given up)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reusable(self) -> bool:
        return (
            self.complete
            and self.keep_alive
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def until_head(self) -> None:
        while not self.head:
            await self._wait()

    async def whole(self) -> bytes:
        """The rest of the reply's body, once it has all come."""
        self._whole = True  # all of it is kept anyway: reading need not pause
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        while not self.complete:
            await self._wait()
        body = b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The reply's body as it arrives, until its end."""
        while True:
            if self._body:
                chunk = self._body.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered <= LOW_WATER and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield chunk
            elif self.complete:
                return
            else:
                await self._wait()

    async def _wait(self) -> None:
        self._raise()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        self._raise()

    def _raise(self) -> None:
        if self.timed_out:
            raise TimeoutError("the model server did not answer in time")
        if self.error is not None:
            raise self.error

    def _expire(self) -> None:
        self._timer = None
        if not self.complete:
            self.timed_out = True
            self.close()
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.close()
        self._wake()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.complete:  # nothing was asked: a server out of step
            self._fail(UpstreamError("the model server sent data no request asked for"))
            return
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(UpstreamError(f"the model server's reply is not HTTP/1.1: {exc}"))
            return
        if (
            self._buffered > HIGH_WATER
            and not self._whole
            and not self._paused
            and self.transport is not None
        ):
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost says what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.busy and self.head and not self.complete and not self._framed:
            self.complete = True  # a body that ends where the connection does
        elif self.busy and not self.complete and self.error is None:
            said = f": {exc}" if exc else ""
            where = "in its reply" if self.received else "before it answered"
            self.error = UpstreamError(f"the model server closed the connection {where}{said}")
        self._wake()

    # -- httptools' callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.head = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()


class Reply:
    """A reply in progress: its status, then its body (`read`, or `chunks` as it comes)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = connection.status

    def chunks(self) -> AsyncIterator[bytes]:
        return self._connection.chunks()

    async def read(self) -> bytes:
        return await self._connection.whole()


class Upstream:
    """POSTs to one model server over a pool of keep-alive connections (`limit` at once;
    more wait). `url` is the server's base (`http://host:8000/v1`): paths are under it.
    `headers` go on every request (the service key). `timeout` bounds a request from its
    sending to the end of its reply, a streamed one too (None: no bound)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        limit: int = 100,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._base = parts.path.rstrip("/").encode()
        lines = [f"Host: {parts.netloc}", "Content-Type: application/json"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        for line in lines:
            if "\r" in line or "\n" in line:
                raise ValueError("a header of the model server's requests holds a line break")
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self.timeout = timeout
        self.limit = limit
        self._slots: asyncio.Semaphore | None = None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """The reply's status and whole body."""
        deadline = self._deadline()
        slots = await self._slot(deadline)
        try:
            connection = await self._send(self._request(path, body), deadline)
            try:
                return connection.status, await connection.whole()
            finally:
                self._release(connection)
        finally:
            slots.release()

    @asynccontextmanager
    async def stream(self, path: str, body: bytes) -> AsyncIterator[Reply]:
        """The reply once its status and headers came; its body is read inside the block (a
        connection left with its reply unread is closed, not reused)."""
        deadline = self._deadline()
        slots = await self._slot(deadline)
        try:
            connection = await self._send(self._request(path, body), deadline)
            try:
                yield Reply(connection)
            finally:
                self._release(connection)
        finally:
            slots.release()

    async def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    def _deadline(self) -> float | None:
        return None if self.timeout is None else asyncio.get_running_loop().time() + self.timeout

    async def _slot(self, deadline: float | None) -> asyncio.Semaphore:
        """One of the `limit` connections taken (give it back to what is returned), waited
        for within the request's time limit: the wait was unbounded, so connections held
        by long streams held every other request with them."""
        slots = self._slots
        if slots is None:
            slots = self._slots = asyncio.Semaphore(self.limit)
        if not slots.locked():
            await slots.acquire()  # free: taken at once, no timer
            return slots
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            raise UpstreamBusyError(
                f"all {self.limit} connections to the model server stayed in use"
            ) from None
        return slots

    def _request(self, path: str, body: bytes) -> bytes:
        return b"".join(
            (b"POST ", self._base, path.encode(), b" HTTP/1.1\r\n", self._head,
             b"Content-Length: %d\r\n\r\n" % len(body), body)
        )  # fmt: skip

    async def _send(self, request: bytes, deadline: float | None) -> _Connection:
        """A connection whose reply to `request` has begun (status and headers read)."""
        while True:
            connection, reused = await self._connection(deadline)
            connection.begin(request, deadline)
            try:
                await connection.until_head()
                return connection
            except UpstreamError:
                self._release(connection)
                if reused and connection.received == 0:
                    continue  # closed while idle: the server never read the request
                raise
            except BaseException:
                self._release(connection)
                raise

    async def _connection(self, deadline: float | None) -> tuple[_Connection, bool]:
        while self._idle:
            connection = self._idle.pop()
            transport = connection.transport
            if not connection.closed and transport is not None and not transport.is_closing():
                return connection, True
            self._open.discard(connection)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except OSError as exc:
            raise UpstreamError(
                f"cannot connect to the model server at {self.host}:{self.port}: {exc}"
            ) from exc
        self._open.add(connection)
        return connection, False

    def _release(self, connection: _Connection) -> None:
        connection.end()
        if connection.reusable() and len(self._idle) < self.limit:
            connection.busy = False
            self._idle.append(connection)
        else:
            connection.close()
            self._open.discard(connection)
