"""Alembic environment: runs migrations on an async engine inside one schema."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from shared.store.engine import async_url
from shared.store.models import Base

config = context.config
URL: str = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or ""
SCHEMA: str = config.attributes.get("schema") or "public"


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table_schema=SCHEMA,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(
        async_url(URL),
        poolclass=NullPool,
        connect_args={"server_settings": {"search_path": SCHEMA}},
    )
    try:
        async with engine.connect() as conn:
            # Several services may migrate at once on first start: one at a time.
            await conn.execute(text("SELECT pg_advisory_lock(hashtext('retrace-migrations'))"))
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
