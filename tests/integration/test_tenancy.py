"""Tenant isolation through the repository layer: no read, write or delete crosses tenants."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert

from shared.errors import CrossTenantError, UnscopedQueryError
from shared.store import Store
from shared.store.agents import AgentNotFoundError, create_agent, get_agent, list_agents
from shared.store.models import Agent, ApiKey, Tenant, Trajectory
from shared.store.tenants import create_tenant, issue_api_key
from tests.support.keys import tenant_for_key


@pytest.fixture
async def two_tenants(store: Store) -> Store:
    async with store.cross_tenant() as session:
        await create_tenant(session, "alpha")
        await create_tenant(session, "beta")
    async with store.tenant("alpha") as session:
        await create_agent(session, "bot", model="m", environment="toolbox")
        await create_agent(session, "alpha-only", model="m", environment="toolbox")
    async with store.tenant("beta") as session:
        await create_agent(session, "bot", model="m2", environment="helpdesk")
    return store


async def test_reads_see_only_own_rows(two_tenants: Store) -> None:
    async with two_tenants.tenant("beta") as session:
        assert [a.name for a in await list_agents(session)] == ["bot"]
        assert (await get_agent(session, "bot")).model == "m2"
        with pytest.raises(AgentNotFoundError):
            await get_agent(session, "alpha-only")
        assert await session.scalar(select(func.count()).select_from(Agent)) == 1
        # Even a direct lookup by primary key of alpha's row finds nothing.
        async with two_tenants.tenant("alpha") as other:
            alpha_id = (await get_agent(other, "alpha-only")).id
        assert await session.get(Agent, alpha_id) is None
        # The tenants table itself is scoped too.
        assert [t.id for t in await session.scalars(select(Tenant))] == ["beta"]


async def test_joins_and_subqueries_are_scoped(two_tenants: Store) -> None:
    async with two_tenants.tenant("beta") as session:
        names = await session.scalars(
            select(Agent.name).join(Tenant, Tenant.id == Agent.tenant_id).order_by(Agent.name)
        )
        assert list(names) == ["bot"]
        assert await session.scalar(select(func.count()).where(Agent.id.in_(select(Agent.id)))) == 1


async def test_bulk_update_and_delete_cannot_reach_other_tenant(two_tenants: Store) -> None:
    async with two_tenants.tenant("beta") as session:
        await session.execute(update(Agent).values(model="hijacked"))
        await session.execute(delete(Agent).where(Agent.name == "alpha-only"))
    async with two_tenants.tenant("alpha") as session:
        models = {a.name: a.model for a in await list_agents(session)}
    assert models == {"bot": "m", "alpha-only": "m"}


async def test_writes_for_another_tenant_are_refused(two_tenants: Store) -> None:
    with pytest.raises(CrossTenantError):
        async with two_tenants.tenant("beta") as session:
            session.add(Agent(tenant_id="alpha", name="sneaky", model="m", environment="e"))
    with pytest.raises(CrossTenantError):
        async with two_tenants.tenant("beta") as session:
            await session.execute(
                insert(Agent).values(
                    tenant_id="alpha",
                    name="sneaky2",
                    model="m",
                    environment="e",
                    system_prompt="",
                    config={},
                    production_adapters=[],
                )
            )
    with pytest.raises(CrossTenantError):
        async with two_tenants.tenant("beta") as session:
            agent = await get_agent(session, "bot")
            agent.tenant_id = "alpha"
    with pytest.raises(CrossTenantError):
        async with two_tenants.tenant("beta") as session:
            await session.execute(update(Agent).values(tenant_id="alpha"))
    async with two_tenants.tenant("alpha") as session:
        assert sorted(a.name for a in await list_agents(session)) == ["alpha-only", "bot"]


async def test_unscoped_session_cannot_touch_tenant_rows(two_tenants: Store) -> None:
    async with two_tenants._sessions() as session:  # neither tenant nor cross-tenant
        with pytest.raises(UnscopedQueryError):
            await session.execute(select(Agent))
        with pytest.raises(UnscopedQueryError):
            await session.execute(select(Trajectory.id))
        with pytest.raises(UnscopedQueryError):
            await session.execute(delete(ApiKey))
        # Raw SQL that touches no mapped table is allowed.
        assert await session.scalar(text("SELECT 1")) == 1


async def test_api_keys_resolve_to_their_tenant_only(two_tenants: Store) -> None:
    async with two_tenants.tenant("alpha") as session:
        key = await issue_api_key(session, "alpha")
    async with two_tenants.cross_tenant() as session:
        assert await tenant_for_key(session, key) == "alpha"
        assert await tenant_for_key(session, key + "x") is None
        stored = await session.scalar(select(ApiKey.key_hash))
    assert stored is not None and key not in stored


async def test_same_agent_name_in_two_tenants_is_fine(two_tenants: Store) -> None:
    async with two_tenants.cross_tenant() as session:
        rows = await session.execute(select(Agent.tenant_id).where(Agent.name == "bot"))
        assert sorted(r[0] for r in rows) == ["alpha", "beta"]
