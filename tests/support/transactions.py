"""What Postgres says about open transactions: the check that long work holds none."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text

from shared.store import Store


async def open_transactions(store: Store, *, begun_before: datetime) -> int:
    """Connections of `store`'s deployment (its schema's `application_name`; other than the
    asking one) idle inside a transaction that began before `begun_before` (the database's
    clock, see `database_now`): one held through the work that began then. Tests running
    beside it, in other schemas, are not counted."""
    async with store.cross_tenant() as session:
        count = await session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = current_setting('application_name') "
                "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid() "
                "AND xact_start < :before"
            ),
            {"before": begun_before},
        )
    return int(count or 0)


async def database_now(store: Store) -> datetime:
    """The database's clock (what `xact_start` is measured by)."""
    async with store.cross_tenant() as session:
        moment = await session.scalar(text("SELECT clock_timestamp()"))
    assert isinstance(moment, datetime)
    return moment
