"""`retrace status` lists the cycles under way, with agent, stage and trigger, across tenants."""

from __future__ import annotations

from shared.cli.status import _cycles
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Cycle
from shared.store.tenants import create_tenant


async def test_status_shows_active_cycles_by_agent_and_stage(store: Store) -> None:
    async with store.cross_tenant() as session:
        for tenant in ("acme", "beta"):
            await create_tenant(session, tenant)
    for tenant, state in (("acme", "training"), ("beta", "completed")):
        async with store.tenant(tenant) as session:
            agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
            session.add(Cycle(agent_id=agent.id, state=state, trigger="monitor"))
    counts, active = await _cycles(store)
    assert counts == {"training": 1, "completed": 1}
    [only] = active
    assert (only.tenant, only.agent, only.state, only.trigger) == (
        "acme",
        "bot",
        "training",
        "monitor",
    )
    assert 0 <= only.age_s < 60
