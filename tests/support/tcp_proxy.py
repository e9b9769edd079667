"""A TCP forwarder to put between a service and a real server (Postgres), to cut: every
connection through it dropped and new ones refused, as a server that went down looks to its
clients, until it is restored. The server itself is never touched (others share it)."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def cut(self) -> None:
        """Connections dropped, new ones refused (the port closed)."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def restore(self) -> None:
        await self.start()  # on the same port

    async def close(self) -> None:
        if self._server is not None:
            await self.cut()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}
