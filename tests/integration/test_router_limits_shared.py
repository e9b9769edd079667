"""Router processes share what they let through over real Postgres notifications: the
counts reach the other processes of the same schema only, a notification that is not one
is ignored, and what a process let through before it could tell anyone is never told."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from services.router.limits import CHANNEL, SpendingExchange, TenantLimits
from shared.config import DatabaseConfig
from shared.store import Store
from shared.store.changes import asyncpg_dsn
from tests.integration.test_delivery import eventually

pytestmark = pytest.mark.timeout(60)


async def test_counts_reach_the_schema_s_other_processes_and_none_told_late(
    store: Store, db_cfg: DatabaseConfig
) -> None:
    dsn = asyncpg_dsn(store.engine.url)
    mine, other, elsewhere = TenantLimits(), TenantLimits(), TenantLimits()
    assert [mine.take("acme", 0.05, 3) for _ in range(3)] == [0.0, 0.0, 0.0]  # while deaf
    exchanges = [
        SpendingExchange(dsn, db_cfg.schema, mine, interval_s=0.05),
        SpendingExchange(dsn, db_cfg.schema, other, interval_s=0.05),
        SpendingExchange(dsn, f"{db_cfg.schema}_x", elsewhere, interval_s=0.05),
    ]
    for exchange in exchanges:
        exchange.start()
    try:

        async def live() -> bool:
            return all(e.live for e in exchanges)

        await eventually(live, within=15)
        async with store.cross_tenant() as session:  # not a count: ignored, nothing breaks
            await session.execute(
                text("SELECT pg_notify(:channel, '[[[ not json')"), {"channel": CHANNEL}
            )
        assert [mine.take("globex", 0.05, 2) for _ in range(2)] == [0.0, 0.0]
        await asyncio.sleep(1.0)  # twenty intervals
        assert other.take("globex", 0.05, 2) > 0  # the two let through there: none left here
        assert other.take("acme", 0.05, 3) == 0.0  # acme's three, let through deaf: untold
        assert elsewhere.take("globex", 0.05, 2) == 0.0  # another deployment's schema
        assert all(e.live for e in exchanges)
    finally:
        for exchange in exchanges:
            await exchange.close()
