"""A tenant's API keys: revoked and rotated by prefix, each tenant only its own (issue 14:
no revocation or rotation)."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from shared.store import Store
from shared.store.models import ApiKey
from shared.store.tenants import (
    ScopeError,
    Surface,
    UnknownKeyError,
    create_tenant,
    hash_key,
    issue_api_key,
    list_api_keys,
    live_key,
    revoke_api_key,
    scope_refusal,
)
from tests.support.keys import tenant_for_key


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


async def test_a_key_whose_prefix_others_share_is_revoked_by_its_id(store: Store) -> None:
    """Issue 14 review: a key's shown prefix is its first 16 characters, `rt_<tenant>_...`,
    so for a tenant id of 12 characters or more every key of the tenant has the same one, and
    a leaked key the operator does not hold could not be revoked at all."""
    tenant = "northwind-traders"
    async with store.cross_tenant() as session:
        await create_tenant(session, tenant)
        await create_tenant(session, "other")
    async with store.tenant(tenant) as session:
        leaked = await issue_api_key(session, tenant, "leaked")
        kept = await issue_api_key(session, tenant, "kept")
        assert leaked[:16] == kept[:16]
        with pytest.raises(UnknownKeyError, match="give the key's id"):
            await revoke_api_key(session, leaked[:16])
        rows = {k.name: k for k in await list_api_keys(session)}
    async with store.tenant("other") as session:
        with pytest.raises(UnknownKeyError, match="no live key has the id"):
            await revoke_api_key(session, str(rows["leaked"].id))  # not the tenant's own
    async with store.tenant(tenant) as session:
        revoked = await revoke_api_key(session, str(rows["leaked"].id))
        assert revoked.name == "leaked" and revoked.revoked_at is not None
        with pytest.raises(UnknownKeyError, match="no live key has the id"):
            await revoke_api_key(session, str(rows["leaked"].id))  # once
    async with store.cross_tenant() as session:
        assert await tenant_for_key(session, leaked) is None
        assert await tenant_for_key(session, kept) == tenant


async def test_a_key_has_one_of_the_known_scopes_and_the_table_holds_it(store: Store) -> None:
    """A scope retrace does not have is refused when the key is made, and the table's check
    refuses one written round `issue_api_key`; a key made without one is `all`."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        with pytest.raises(ScopeError, match="inference"):
            await issue_api_key(session, "acme", "app", scope="admin")
        made = await issue_api_key(session, "acme", "app", scope="inference")
        old = await issue_api_key(session, "acme", "old")
    async with store.cross_tenant() as session:
        assert {(k.name, k.scope) for k in await list_api_keys(session)} == {
            ("old", "all"),
            ("app", "inference"),
        }
        row = await live_key(session, made)
        assert row is not None and row.scope == "inference"
    with pytest.raises(IntegrityError, match="ck_api_keys_scope"):
        async with store.cross_tenant() as session:
            await session.execute(
                update(ApiKey).where(ApiKey.key_hash == hash_key(old)).values(scope="root")
            )


@pytest.mark.parametrize(
    ("scope", "surface", "method", "allowed"),
    [
        ("all", "router", "POST", True), ("all", "control", "DELETE", True),
        ("all", "console", "GET", True),
        ("inference", "router", "POST", True), ("inference", "control", "GET", False),
        ("inference", "console", "GET", False),
        ("read", "router", "POST", False), ("read", "router", "GET", False),
        ("read", "control", "GET", True), ("read", "control", "POST", False),
        ("read", "control", "DELETE", False), ("read", "console", "GET", True),
        ("root", "control", "GET", False),
    ],
)  # fmt: skip
def test_what_each_scope_reaches(scope: str, surface: Surface, method: str, allowed: bool) -> None:
    assert (scope_refusal(scope, surface, method) is None) == allowed
