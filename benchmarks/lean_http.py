"""A lean HTTP/1.1 client for load generators: one keep-alive connection per client, the
request written as one prepared buffer, the reply read by its Content-Length. It parses
only what a closed-loop load generator needs (the status, the body's length), so it spends
a fraction of aiohttp's client CPU a request: on a 2-core machine the generator shares the
cores with what it measures, and every millisecond it spends is one the server under test
does not get (`benchmarks/router_overhead.py`, docs/benchmarks.md).

Not a general client: no redirects, no chunked or compressed replies (a reply without a
Content-Length is an error, as is one the server closes mid-way).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HttpError(Exception):
    """A reply this client cannot read, or a connection lost before the reply ended."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._head: tuple[int, int, int] | None = None
        """The reply's status, and where its body starts and ends in the buffer."""
        self._waiting: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(HttpError(f"connection closed before the reply ended ({exc!r})"))

    def _fail(self, exc: HttpError) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(exc)
        self._waiting = None

    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None and self._waiting is None
        self._waiting = asyncio.get_running_loop().create_future()
        self._buffer.clear()
        self._head = None
        self.transport.write(data)
        return self._waiting

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                status, length = _head(bytes(self._buffer[:end]))
            except HttpError as exc:
                self._fail(exc)
                if self.transport is not None:
                    self.transport.close()
                return
            self._head = (status, end + 4, end + 4 + length)
        status, start, stop = self._head
        if len(self._buffer) >= stop and self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            if not waiting.done():
                waiting.set_result((status, bytes(self._buffer[start:stop])))


def _head(head: bytes) -> tuple[int, int]:
    """The status and the body's length, from a reply's head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    length: int | None = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            text = value.strip()
            if not text.isdigit():
                raise HttpError(f"bad Content-Length: {text[:40]!r}")
            length = int(text)
    if length is None:
        raise HttpError("a reply without a Content-Length (chunked replies are not read)")
    return int(parts[1]), length


class LeanClient:
    """POSTs to one URL over one keep-alive connection, reconnecting when the server closed
    it between requests."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"an http:// URL with a host is needed, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._prefix = (
            f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: "
        ).encode()
        self._conn: _Connection | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """The status and body of the reply to `body` (JSON) posted."""
        if self._conn is None or self._conn.closed:
            _, self._conn = await asyncio.get_running_loop().create_connection(
                _Connection, self.host, self.port
            )
        request = b"%s%d\r\n\r\n%s" % (self._prefix, len(body), body)
        try:
            return await self._conn.send(request)
        except HttpError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None
