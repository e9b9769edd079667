"""A connection that listens on a Postgres notification channel for as long as it can: one
asyncpg connection of its own (notifications need a session that stays), connected again
with backoff whenever it breaks. What to do with it is a subclass's: `heard` for each
notification, `listening` once it listens again, `serve` while it does (returning only by
an error: a dead connection must show there), `lost` when it broke."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg


class Listening:
    """Listens on `channel` from `start` to `close`; `live` while it does."""

    def __init__(
        self, dsn: str, channel: str, application_name: str, *, retry_s: float = 1.0
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.application_name = application_name[:63]
        """How its connection shows in `pg_stat_activity`."""
        self.retry_s = retry_s
        self.live = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.application_name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.live = False

    def heard(self, payload: str) -> None:
        """A notification on the channel (any sender's, this process's own included)."""

    def listening(self) -> None:
        """It listens (again): what was missed meanwhile is never heard."""

    async def serve(self, conn: asyncpg.Connection) -> None:
        """While it listens; an error ends it (the connection is made again)."""
        raise NotImplementedError

    def lost(self, exc: BaseException, retry_in_s: float) -> None:
        """It broke (or never connected); `live` still says whether it was listening."""

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.heard(payload)

    async def _run(self) -> None:
        delay = self.retry_s
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self.dsn,
                    timeout=10,
                    server_settings={"application_name": self.application_name},
                )
                await conn.add_listener(self.channel, self._notified)
                self.listening()
                self.live = True
                delay = self.retry_s
                await self.serve(conn)
            except Exception as exc:  # noqa: BLE001  whatever broke it, listen again
                self.lost(exc, delay)
            finally:
                self.live = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
