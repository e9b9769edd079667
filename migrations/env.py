"""Alembic environment: runs migrations on an async engine inside one schema."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from shared.logging import get_logger
from shared.store.engine import async_url
from shared.store.models import Base

config = context.config
URL: str = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or ""
SCHEMA: str = config.attributes.get("schema") or "public"
LOCK_POLL_S = 0.1
LOCK_SAY_S = 30.0
log = get_logger(__name__)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table_schema=SCHEMA,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _lock(conn: AsyncConnection) -> None:
    """Several services may migrate at once on first start: one at a time. The lock is tried,
    not waited for: a session waiting inside `pg_advisory_lock` holds a snapshot, which a
    `CREATE INDEX CONCURRENTLY` in the migrating session waits out (0011): a deadlock."""
    lock = text("SELECT pg_try_advisory_lock(hashtext('retrace-migrations'))")
    loop = asyncio.get_running_loop()
    started = said = loop.time()
    while not await conn.scalar(lock):
        await conn.commit()
        if loop.time() - said >= LOCK_SAY_S:
            said = loop.time()
            # an index built CONCURRENTLY waits out every older transaction in the database
            log.info(
                "waiting for another process's migration",
                schema=SCHEMA,
                waited_s=round(said - started),
            )
        await asyncio.sleep(LOCK_POLL_S)
    await conn.commit()


async def _run_async() -> None:
    engine = create_async_engine(
        async_url(URL),
        poolclass=NullPool,
        connect_args={"server_settings": {"search_path": SCHEMA}},
    )
    try:
        async with engine.connect() as conn:
            await _lock(conn)
            try:
                await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"'))
                await conn.commit()
                await conn.run_sync(_run)
                await conn.commit()
            finally:
                await conn.execute(
                    text("SELECT pg_advisory_unlock(hashtext('retrace-migrations'))")
                )
                await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=async_url(URL), target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
