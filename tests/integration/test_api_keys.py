"""A tenant's API keys: revoked and rotated by prefix, each tenant only its own (issue 14:
no revocation or rotation)."""

from __future__ import annotations

import pytest

from shared.store import Store
from shared.store.tenants import (
    UnknownKeyError,
    create_tenant,
    issue_api_key,
    list_api_keys,
    revoke_api_key,
    tenant_for_key,
)


async def test_revoke_and_rotate_by_prefix(store: Store) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
        await create_tenant(session, "other")
    async with store.tenant("acme") as session:
        first = await issue_api_key(session, "acme", "ci")
        second = await issue_api_key(session, "acme", "laptop")
    async with store.tenant("other") as session:
        theirs = await issue_api_key(session, "other")
    async with store.cross_tenant() as session:
        assert await tenant_for_key(session, first) == "acme"
    # both acme keys share their first 16 characters' first part: too short a prefix is refused
    async with store.tenant("acme") as session:
        with pytest.raises(UnknownKeyError, match="at least"):
            await revoke_api_key(session, "rt_")
        with pytest.raises(UnknownKeyError, match="no live key"):
            await revoke_api_key(session, theirs[:16])  # another tenant's key: not found here
        revoked = await revoke_api_key(session, first)  # the whole key works as a prefix
        assert revoked.name == "ci" and revoked.revoked_at is not None
        with pytest.raises(UnknownKeyError, match="no live key"):
            await revoke_api_key(session, first)  # once
        keys = await list_api_keys(session)
    assert {(k.name, k.revoked_at is None) for k in keys} == {("ci", False), ("laptop", True)}
    async with store.cross_tenant() as session:
        assert await tenant_for_key(session, first) is None
        assert await tenant_for_key(session, second) == "acme"
        assert await tenant_for_key(session, theirs) == "other"
