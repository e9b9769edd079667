"""Requests no HTTP client library will send (header bytes that are not UTF-8), written
straight to a socket."""

from __future__ import annotations

import asyncio


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
