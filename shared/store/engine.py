"""The Postgres connection: one async engine per process and tenant-scoped sessions."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from shared.config import DatabaseConfig
from shared.errors import ConfigError
from shared.store import scope  # noqa: F401  (installs the tenant-scoping listeners)
from shared.store.scope import CROSS_TENANT_KEY, TENANT_KEY
from shared.subjects import validate_tenant

STORE_ERRORS = (
    SQLAlchemyError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # connecting to a Postgres that is down: asyncpg raises these bare, SQLAlchemy does not
    # wrap them (a stopped server's Unix socket is gone: FileNotFoundError; its host name
    # unknown while its container is away: gaierror)
    ConnectionRefusedError,
    FileNotFoundError,
    TimeoutError,
    socket.gaierror,
)
"""What a store that cannot serve a request raises (a client that hangs up is not one): an
HTTP surface answers these with a 503 and `Retry-After`. aiohttp's client timeouts are
TimeoutErrors too: a surface that calls other services lets `aiohttp.ClientError` through
first (`not_the_store`)."""


def not_the_store(exc: BaseException) -> bool:
    """An error among `STORE_ERRORS` by its class that came from an HTTP client, not from
    Postgres."""
    import aiohttp

    return isinstance(exc, aiohttp.ClientError)


def async_url(url: str) -> str:
    """Accept `postgres://`, `postgresql://` or an explicit driver; use asyncpg."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"RETRACE_DATABASE_URL: not a database URL ({exc})") from exc
    if parsed.get_backend_name() not in ("postgres", "postgresql"):
        raise ConfigError(
            f"RETRACE_DATABASE_URL: retrace needs Postgres, got {parsed.drivername!r}"
        )
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def application_name(schema: str) -> str:
    """The `application_name` retrace's connections to `schema` carry (Postgres keeps 63
    characters)."""
    return f"retrace/{schema}"[:63]


def create_engine(cfg: DatabaseConfig, url: str) -> AsyncEngine:
    return create_async_engine(
        async_url(url),
        pool_size=cfg.pool_size,
        max_overflow=cfg.pool_size,
        pool_pre_ping=True,  # a restarted Postgres leaves dead connections in the pool
        pool_recycle=1800,
        # a failed statement's error must not carry its parameters (user messages, model
        # replies) into the logs
        hide_parameters=True,
        connect_args={
            "timeout": cfg.connect_timeout,
            "server_settings": {
                "search_path": cfg.schema,
                "statement_timeout": str(cfg.statement_timeout_ms),
                # per schema: what Postgres shows for one deployment (or one test) is its own
                "application_name": application_name(cfg.schema),
                # every statement is planned for its own parameters: each carries a tenant,
                # and one tenant's ten rows are another's ten million, so no one plan fits
                # all; and Postgres's generic plan of a statement prepared five times, made
                # while a table was nearly empty, read every conversation of the tenant to
                # move a batch of them on (17 ms a batch at 20,000, the store's busiest
                # statement under the router's load: docs/benchmarks.md)
                "plan_cache_mode": "force_custom_plan",
            },
        },
    )


class Store:
    """Sessions on one engine; each is either scoped to a tenant or explicitly cross-tenant."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def connect(cls, cfg: DatabaseConfig, url: str) -> Store:
        return cls(create_engine(cfg, url))

    @asynccontextmanager
    async def tenant(self, tenant_id: str) -> AsyncIterator[AsyncSession]:
        """A transaction that can only see and write `tenant_id`'s rows; commits on success."""
        validate_tenant(tenant_id)
        async with self._sessions(info={TENANT_KEY: tenant_id}) as session, session.begin():
            yield session

    @asynccontextmanager
    async def cross_tenant(self) -> AsyncIterator[AsyncSession]:
        """A transaction over all tenants, for the control plane only (tenants, status)."""
        async with self._sessions(info={CROSS_TENANT_KEY: True}) as session, session.begin():
            yield session

    async def ping(self, limit_s: float = 2.0) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text(f"SET LOCAL statement_timeout = {int(limit_s * 1000)}"))
            await conn.execute(text("SELECT 1"))

    async def close(self) -> None:
        await self.engine.dispose()
