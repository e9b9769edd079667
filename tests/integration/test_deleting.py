"""Deleting an agent or a tenant: everything recorded for it goes with it (the foreign keys
cascade), another tenant's rows stay, and work in progress refuses the deletion."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from shared.errors import PermanentError
from shared.store import Store
from shared.store.agents import AgentBusyError, create_agent, delete_agent, get_agent
from shared.store.models import ApiKey, Cycle, Trajectory
from shared.store.tenants import TenantBusyError, create_tenant, delete_tenant, issue_api_key

pytestmark = [pytest.mark.timeout(60)]


async def _tenant_with_agent(store: Store, tenant: str) -> uuid.UUID:
    async with store.cross_tenant() as session:
        await create_tenant(session, tenant)
    async with store.tenant(tenant) as session:
        await issue_api_key(session, tenant)
        agent = await create_agent(session, "bot", model="m", environment="toolbox")
        session.add(
            Trajectory(agent_id=agent.id, request_id=uuid.uuid4(), messages=[], source="rollout")
        )
        return agent.id


async def _count(store: Store, tenant: str, model: type) -> int:
    async with store.tenant(tenant) as session:
        return int(await session.scalar(select(func.count()).select_from(model)) or 0)


async def test_an_agent_goes_with_its_records_and_not_while_it_works(store: Store) -> None:
    agent_id = await _tenant_with_agent(store, "acme")
    await _tenant_with_agent(store, "other")
    async with store.tenant("acme") as session:
        session.add(Cycle(agent_id=agent_id, state="training", trigger="manual"))
    with pytest.raises(AgentBusyError, match=r"work in progress: cycle .* \(training\)"):
        async with store.tenant("acme") as session:
            await delete_agent(session, "bot")
    async with store.tenant("acme") as session:
        cycle = await session.scalar(select(Cycle))
        assert cycle is not None
        cycle.state = "completed"
    async with store.tenant("acme") as session:
        await delete_agent(session, "bot")
    assert await _count(store, "acme", Trajectory) == 0
    assert await _count(store, "acme", Cycle) == 0
    assert await _count(store, "other", Trajectory) == 1  # another tenant's agent of that name
    async with store.tenant("other") as session:
        assert (await get_agent(session, "bot")).name == "bot"
    with pytest.raises(PermanentError, match="no agent named 'bot'"):
        async with store.tenant("acme") as session:
            await delete_agent(session, "bot")


async def test_a_tenant_goes_with_everything_of_its(store: Store) -> None:
    agent_id = await _tenant_with_agent(store, "acme")
    await _tenant_with_agent(store, "other")
    async with store.tenant("acme") as session:
        session.add(Cycle(agent_id=agent_id, state="evaluating", trigger="manual"))
    with pytest.raises(TenantBusyError, match="evaluating"):
        async with store.tenant("acme") as session:
            await delete_tenant(session, "acme")
    async with store.tenant("acme") as session:
        cycle = await session.scalar(select(Cycle))
        assert cycle is not None
        cycle.state = "failed"
    async with store.tenant("acme") as session:
        await delete_tenant(session, "acme")
    for model in (ApiKey, Trajectory, Cycle):
        assert await _count(store, "acme", model) == 0
    assert await _count(store, "other", ApiKey) == 1 and await _count(store, "other", Trajectory)
    with pytest.raises(PermanentError, match="no tenant 'acme'"):
        async with store.tenant("acme") as session:
            await delete_tenant(session, "acme")
