"""Requests no HTTP client library will send (header bytes that are not UTF-8), and callers
no client library is (one that stops reading), written straight to a socket."""

from __future__ import annotations

import asyncio
import socket


async def raw_status(port: int, head: bytes) -> int:
    """The status of the reply to `head` (a request line and its headers, without the blank
    line that ends them), sent to 127.0.0.1:`port` with `Connection: close`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


async def sent_and_never_read(
    port: int, head: bytes, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST of `body` (its request line and headers in `head`, without `Content-Length`
    and the blank line) to 127.0.0.1:`port` from a socket with a small receive buffer, from
    which the caller then reads nothing: what the server writes soon fills it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(head + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    return reader, writer
