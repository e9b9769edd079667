"""Which tenant a presented key reaches, as the tests ask it."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from shared.store.tenants import live_key


async def tenant_for_key(session: AsyncSession, key: str) -> str | None:
    """The tenant of the live key `key`, or None (a cross-tenant session)."""
    row = await live_key(session, key) if key else None
    return row.tenant_id if row else None
