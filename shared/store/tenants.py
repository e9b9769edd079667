"""Tenants and their API keys (keys are stored only as SHA-256 hashes)."""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.errors import PermanentError
from shared.store.models import ApiKey, Tenant
from shared.subjects import validate_tenant

KEY_PREFIX = "rt_"
KEY_TOKEN_BYTES = 24
KEY_RE = re.compile(r"\Art_[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?_[A-Za-z0-9_-]{32}\Z")
"""What `issue_api_key` makes (the prefix, the tenant id, 24 random bytes in URL-safe
base64): anything else is no key of ours, refused without a store lookup."""


SCOPES: dict[str, str] = {
    "all": "every route: the router, the control API (keys included) and the console",
    "read": "the control API's reads and the console; not the router, nothing changed",
    "inference": "the router only (chat completions, the list of models, feedback on its "
    "tenant's conversations)",
}
"""What a key may do. An application's key needs `inference` alone: leaked, it cannot mint
keys, change agents or read other users' trajectories."""
Surface = Literal["router", "control", "console"]
READS = frozenset({"GET", "HEAD", "OPTIONS"})


class TenantExistsError(PermanentError):
    """A tenant with that id already exists."""


class ScopeError(PermanentError):
    """A key scope retrace does not have."""


def validate_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise ScopeError(f"key scope must be one of {', '.join(SCOPES)}, not {scope[:40]!r}")
    return scope


def scope_refusal(scope: str, surface: Surface, method: str = "GET") -> str | None:
    """Why a key of `scope` may not make this call (`method` on `surface`), or None."""
    if scope == "all":
        return None
    if scope == "inference":
        if surface == "router":
            return None
        return "this key's scope is inference: it may call the router only"
    if scope == "read":
        if surface == "router":
            return "this key's scope is read: it may not call the router"
        if method not in READS:
            return "this key's scope is read: it may not change anything"
        return None
    return f"this key has a scope retrace does not know ({scope[:40]!r})"


def well_formed(key: str) -> bool:
    """Whether `key` has the shape of a key `issue_api_key` makes."""
    return KEY_RE.match(key) is not None


def hash_key(key: str) -> str:
    """The stored form of a key. A presented one that is not UTF-8 (aiohttp keeps a header's
    other bytes as surrogates) hashes as the bytes it was: a key never issued, so a 401, not
    a 500 raised before the key was checked."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


async def create_tenant(session: AsyncSession, tenant_id: str, name: str | None = None) -> Tenant:
    """Insert a tenant (needs a cross-tenant session)."""
    validate_tenant(tenant_id)
    if await session.get(Tenant, tenant_id) is not None:
        raise TenantExistsError(f"tenant {tenant_id!r} already exists")
    tenant = Tenant(id=tenant_id, name=name or tenant_id)
    session.add(tenant)
    await session.flush()
    return tenant


async def issue_api_key(
    session: AsyncSession, tenant_id: str, name: str = "default", scope: str = "all"
) -> str:
    """Create a key for the session's tenant and return it; only its hash is kept.
    `ScopeError` for a scope not in `SCOPES`."""
    validate_scope(scope)
    key = KEY_PREFIX + tenant_id + "_" + secrets.token_urlsafe(KEY_TOKEN_BYTES)
    session.add(
        ApiKey(tenant_id=tenant_id, name=name, prefix=key[:16], key_hash=hash_key(key), scope=scope)
    )
    await session.flush()
    return key


class UnknownKeyError(PermanentError):
    """No live key of the tenant starts with that prefix (or more than one does)."""


async def list_api_keys(session: AsyncSession) -> list[ApiKey]:
    """The session's tenant's keys, newest first, revoked ones included."""
    return list(await session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc())))


async def revoke_api_key(session: AsyncSession, ref: str) -> ApiKey:
    """Revoke one of the session tenant's live keys, named by `ref`: its id (what `retrace
    tenant key list` and GET /v1/keys show), the whole key, or the first characters of it
    (at least 8; the 16 shown as its prefix name it only where the tenant id is short, so a
    key whose prefix another live key shares is revoked by its id). The router refuses it
    from its next request."""
    key_id = _uuid_or_none(ref)
    if key_id is not None:
        row = await session.get(ApiKey, key_id)
        if row is None or row.revoked_at is not None:
            raise UnknownKeyError(f"no live key has the id {key_id}")
        return await _revoked(session, row)
    if len(ref) < 8:
        raise UnknownKeyError("give the key's id, or at least the first 8 characters of the key")
    live = [
        k
        for k in await session.scalars(
            select(ApiKey).where(ApiKey.revoked_at.is_(None), ApiKey.prefix.startswith(ref[:16]))
        )
        if len(ref) <= 16 or k.key_hash == hash_key(ref)
    ]
    if len(live) != 1:
        raise UnknownKeyError(
            f"no live key starts with {ref[:16]!r}"
            if not live
            else f"{len(live)} live keys start with {ref[:16]!r}: give the key's id (from the "
            "list of keys) or the whole key"
        )
    return await _revoked(session, live[0])


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


async def _revoked(session: AsyncSession, row: ApiKey) -> ApiKey:
    row.revoked_at = datetime.now(UTC)
    await session.flush()
    return row


def _presented(key: str) -> Any:
    """The live (unrevoked) key row a presented key is."""
    return (ApiKey.key_hash == hash_key(key)) & ApiKey.revoked_at.is_(None)


async def live_key(session: AsyncSession, key: str) -> ApiKey | None:
    """The live (unrevoked) key row a presented key is, or None (a cross-tenant session)."""
    return await session.scalar(select(ApiKey).where(_presented(key)))


async def live_key_and_quotas(session: AsyncSession, key: str) -> tuple[ApiKey, Any] | None:
    """The live key row a presented key is, with its tenant's stored quotas (one query; a
    cross-tenant session), or None."""
    found = (
        await session.execute(
            select(ApiKey, Tenant.quotas)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(_presented(key))
        )
    ).first()
    return (found[0], found[1]) if found is not None else None


class TenantBusyError(PermanentError):
    """The tenant has work in progress."""


async def delete_tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    """Delete a tenant and every row of its (keys, agents and all they recorded: the foreign
    keys cascade); refused while it has a cycle or training job in progress. `session` is the
    tenant's own (its work is looked up there); the row goes in the same transaction."""
    from shared.store.agents import TenantNotFoundError, work_in_progress

    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise TenantNotFoundError(f"no tenant {tenant_id!r} (`retrace tenant list`)")
    busy = await work_in_progress(session)
    if busy:
        raise TenantBusyError(
            f"tenant {tenant_id!r} has work in progress: {', '.join(busy)}; cancel it first "
            "(`retrace cancel ID`)"
        )
    await session.execute(delete(Tenant).where(Tenant.id == tenant_id))
    return tenant


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    return list(await session.scalars(select(Tenant).order_by(Tenant.id)))


def adapter_name(tenant: str, agent: str, skill: str, version: int, job_id: uuid.UUID) -> str:
    """An adapter's name on the inference endpoint, which serves every tenant: the tenant
    first, then `/` (no tenant id holds one), so two tenants' adapters never share a name
    whatever their agents and skills are called."""
    return f"{validate_tenant(tenant)}/{agent}--{skill}--v{version}--{str(job_id)[:8]}"
