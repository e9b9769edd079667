"""Row changes announced by Postgres, for the caches that keep rows in memory.

Migrations 0007 and 0009 have every update or delete of an API key, an agent, an adapter or
a tenant notify the channel `retrace_changes` with `<schema>:<table>:<id>` when its
transaction commits, whichever code path made it. `ChangeFeed` holds one connection that
listens and passes on each change in its own schema (a channel is shared by the whole
database).

A cache may serve from memory only while the feed is `live`: a feed that lost its connection
would miss changes, so it says so at once, and when it listens again everything cached is
forgotten (`on_change(None, None)`). `generation` moves on every change and every reconnect;
a reader notes it before reading the store and caches what it read only if it has not moved
(`RowCache.put`), so a row read just before a change that was announced while the read was
in flight is never kept.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import asyncpg

from shared.logging import get_logger
from shared.store.listening import Listening

log = get_logger(__name__)
CHANNEL = "retrace_changes"
APPLICATION = "retrace-change-feed"
"""The start of the feed's connection's name in `pg_stat_activity` (`/<schema>` follows)."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def asyncpg_dsn(sqlalchemy_url: Any) -> str:
    """The plain `postgresql://` DSN of a SQLAlchemy URL (password kept: it is used, not
    shown)."""
    url = sqlalchemy_url.set(drivername="postgresql")
    return str(url.render_as_string(hide_password=False))


class ChangeFeed(Listening):
    """Listens on `retrace_changes` and calls `on_change(table, id)` for each change, and
    `on_change(None, None)` when every cached row must be forgotten (a reconnect)."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        on_change: Callable[[str | None, str | None], None],
        *,
        check_s: float = 5.0,
        retry_s: float = 1.0,
    ) -> None:
        super().__init__(dsn, CHANNEL, f"{APPLICATION}/{schema}", retry_s=retry_s)
        self.schema = schema
        self.on_change = on_change
        self.check_s = check_s
        self.generation = 0

    def _changed(self, table: str | None, row: str | None) -> None:
        self.generation += 1
        self.on_change(table, row)

    def heard(self, payload: str) -> None:
        schema, _, rest = payload.partition(":")
        if schema != self.schema:
            return
        table, _, row = rest.partition(":")
        self._changed(table, row)

    def listening(self) -> None:
        self._changed(None, None)  # what was cached while deaf may be stale
        log.info("listening for row changes")

    async def serve(self, conn: asyncpg.Connection) -> None:
        while True:  # a dead connection shows on the next check
            await asyncio.sleep(self.check_s)
            await asyncio.wait_for(conn.execute("SELECT 1"), self.check_s)

    def lost(self, exc: BaseException, retry_in_s: float) -> None:
        if self.live:
            log.warning("row change feed lost; caches bypassed", error=repr(exc))
        self.generation += 1


class RowCache(Generic[K, V]):
    """Values derived from store rows, served while `feed` is live, dropped when one of their
    rows changes, and kept at most `ttl_s` (a backstop) and `size` entries (oldest out)."""

    def __init__(self, feed: ChangeFeed, ttl_s: float, size: int = 10_000) -> None:
        self.feed = feed
        self.ttl_s = ttl_s
        self.size = size
        self._entries: OrderedDict[K, tuple[float, V, tuple[tuple[str, str], ...]]] = OrderedDict()
        self._by_row: dict[tuple[str, str], set[K]] = {}

    def get(self, key: K, now: float) -> V | None:
        if not self.feed.live:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now - entry[0] > self.ttl_s:
            self._drop(key)
            return None
        return entry[1]

    def put(
        self, key: K, value: V, rows: tuple[tuple[str, str], ...], generation: int, now: float
    ) -> None:
        """Keep `value`, read from `rows` ((table, id) pairs) when the feed was at
        `generation`; not kept if anything changed since (or the feed is not live)."""
        if not self.feed.live or generation != self.feed.generation or self.ttl_s <= 0:
            return
        self._drop(key)
        self._entries[key] = (now, value, rows)
        for row in rows:
            self._by_row.setdefault(row, set()).add(key)
        while len(self._entries) > self.size:
            self._drop(next(iter(self._entries)))

    def changed(self, table: str | None, row: str | None) -> None:
        """A row changed (None, None: everything may have)."""
        if table is None or row is None:
            self._entries.clear()
            self._by_row.clear()
            return
        for key in list(self._by_row.get((table, row), ())):
            self._drop(key)

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        for row in entry[2]:
            keys = self._by_row.get(row)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_row[row]
