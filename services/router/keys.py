"""The hashes of the live API keys, so a key the router does not hold in memory is looked up
without spending the budget that bounds lookups of made-up keys.

Lookups of keys a router process does not hold are a token bucket of their own
(`key_lookups_per_s`), so a flood of made-up keys costs Postgres no more than that. Before
this index, the bucket was every unheld key's: a flood of made-up keys shaped like real ones
spent it, and a real key the process did not hold (one issued since, every key after a
restart or while the change feed reconnected, every key with `cache_s` 0) got a 503 with it.
Now a key whose hash is here is looked up whatever the bucket holds. The index only decides
which bucket a lookup comes out of: the lookup itself reads the store, so a key revoked
since the index was read is still refused, and a key issued since is looked up from the
bucket until the next refresh (every `refresh_s`: the keys' counts and the newest key's
time are read, and the hashes only when those moved).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from sqlalchemy import func, select

from shared.logging import get_logger
from shared.store import Store
from shared.store.engine import STORE_ERRORS
from shared.store.models import ApiKey

log = get_logger(__name__)

LIVE = ApiKey.revoked_at.is_(None)
SHAPE = select(func.count(), func.count().filter(LIVE), func.max(ApiKey.created_at))
"""Every key's count (moved by any key issued or deleted), the live ones' (by a revocation),
the newest's time: the hashes are read again only when one of them moved."""
HASHES = select(ApiKey.key_hash).where(LIVE)


class KeyIndex:
    def __init__(self, store: Store, refresh_s: float) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._hashes: frozenset[str] = frozenset()
        self._found: set[str] = set()
        """Live keys a lookup found since the hashes were read."""
        self._shape: tuple[int, int, datetime | None] | None = None
        """`SHAPE` when the hashes were read."""
        self._task: asyncio.Task[None] | None = None

    def __contains__(self, hashed: str) -> bool:
        return hashed in self._hashes or hashed in self._found

    def __len__(self) -> int:
        return len(self._hashes) + len(self._found - self._hashes)

    def found(self, hashed: str) -> None:
        """A lookup found this key live (issued since the hashes were read)."""
        if hashed not in self._hashes:
            self._found.add(hashed)

    async def refresh(self) -> None:
        """Read the hashes again where `SHAPE` moved (a key issued, revoked or deleted)."""
        async with self.store.engine.connect() as conn:
            every, live, newest = (await conn.execute(SHAPE)).one()
            shape = (every, live, newest)
            if shape == self._shape:
                return
            found_before = set(self._found)  # what is found while the hashes are read stays
            hashes = frozenset((await conn.execute(HASHES)).scalars())
        self._hashes, self._shape = hashes, shape
        self._found -= found_before

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="router-key-index")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except STORE_ERRORS as exc:  # the store out of reach: the index waits
                log.warning("live API keys not read; tried again", error=repr(exc))
            except Exception:  # anything else: said, and tried again (the task must not end)
                log.exception("live API keys not read; tried again")
            await asyncio.sleep(self.refresh_s)
