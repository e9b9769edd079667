"""A test-only contract and handler that record their effects, to observe delivery guarantees."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.bus.delivery import HandlerContext, long_running
from shared.errors import PermanentError
from shared.messages import Contract, register


class Ping(Contract, frozen=True):
    """test -> ping handler."""

    STAGE = "test"
    EVENT = "ping"

    key: str
    crash_on: list[int] = []
    """Attempts on which the handler raises after writing its effect."""
    sleep: float = 0.0
    sleep_on: list[int] | None = None
    """Attempts on which to sleep (all when None)."""
    permanent: bool = False


class Pong(Contract, frozen=True):
    """ping handler -> test."""

    STAGE = "test"
    EVENT = "pong"

    key: str


register(Ping)
register(Pong)

effects_meta = MetaData()
effects = Table(
    "test_effects",
    effects_meta,
    Column("tenant_id", String, primary_key=True),
    Column("key", String, primary_key=True),
    Column("count", Integer, nullable=False),
)


async def handle_ping(msg: Ping, ctx: HandlerContext) -> None:
    stmt = insert(effects).values(tenant_id=ctx.tenant, key=msg.key, count=1)
    await ctx.session.execute(
        stmt.on_conflict_do_update(
            index_elements=["tenant_id", "key"], set_={"count": effects.c["count"] + 1}
        )
    )
    if msg.sleep and (msg.sleep_on is None or ctx.attempt in msg.sleep_on):
        await asyncio.sleep(msg.sleep)
    if msg.permanent:
        raise PermanentError(f"ping {msg.key} can never succeed")
    if ctx.attempt in msg.crash_on:
        raise RuntimeError(f"planted crash on attempt {ctx.attempt}")
    ctx.emit(Pong(key=msg.key))


async def create_effects(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(effects_meta.create_all)


async def effect_counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(effects.c.key, effects.c["count"]))
        return {key: count for key, count in rows}


class LongPing(Contract, frozen=True):
    """test -> long ping handler: work outside any transaction, then a recorded result."""

    STAGE = "test"
    EVENT = "long_ping"

    key: str
    block_s: float = 0.0
    """Seconds the handler first holds the event loop (no heartbeat goes out meanwhile, so
    JetStream redelivers while the handler still works)."""
    work_s: float = 0.0
    """Seconds of "model work" before the result is recorded."""
    crash_on: list[int] = []
    """Attempts on which the handler raises after its work, before recording."""
    record: bool = True
    """Record the result itself (False: leave the recording to the delivery)."""


register(LongPing)

long_runs: dict[str, int] = {}
"""How many times the long handler started, per key."""
long_working: dict[str, asyncio.Event] = {}
"""Set while the long handler of a key is in its work."""


@long_running
async def handle_long_ping(msg: LongPing, ctx: HandlerContext) -> None:
    long_runs[msg.key] = long_runs.get(msg.key, 0) + 1
    long_working.setdefault(msg.key, asyncio.Event()).set()
    time.sleep(msg.block_s)  # noqa: ASYNC251  the point: the event loop held, as busy work holds it
    await asyncio.sleep(msg.work_s)
    long_working[msg.key].clear()
    if ctx.attempt in msg.crash_on:
        raise RuntimeError(f"planted crash on attempt {ctx.attempt}")
    if not msg.record:
        ctx.emit(Pong(key=msg.key))
        return
    async with ctx.record() as session:
        stmt = insert(effects).values(tenant_id=ctx.tenant, key=msg.key, count=1)
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=["tenant_id", "key"], set_={"count": effects.c["count"] + 1}
            )
        )
        ctx.emit(Pong(key=msg.key))
