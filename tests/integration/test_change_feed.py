"""The change feed against a real Postgres: a revoked key, an updated agent and a deleted
adapter are announced with their ids (migration 0007's triggers), only to the feed of their
own schema; a feed whose connection is killed says it is deaf at once, then listens again
and has every cache forget what it held."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import asyncpg
import pytest
from sqlalchemy import delete

from shared.store import Store
from shared.store.agents import create_agent
from shared.store.changes import ChangeFeed, asyncpg_dsn
from shared.store.models import Adapter, Agent
from shared.store.tenants import create_tenant, issue_api_key, revoke_api_key
from tests.integration.test_delivery import eventually

pytestmark = [pytest.mark.timeout(60)]


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    async def check() -> bool:
        return predicate()

    await eventually(check, within)


async def test_changes_are_announced_and_a_lost_connection_is_said(
    store: Store, migrated: str
) -> None:
    seen: list[tuple[str | None, str | None]] = []
    feed = ChangeFeed(
        asyncpg_dsn(store.engine.url),
        migrated,
        lambda table, row: seen.append((table, row)),
        check_s=0.2,
        retry_s=0.1,
    )
    theirs: list[tuple[str | None, str | None]] = []
    other = ChangeFeed(
        asyncpg_dsn(store.engine.url), "another_schema", lambda t, r: theirs.append((t, r))
    )
    feed.start()
    other.start()
    try:
        await until(lambda: feed.live and other.live, within=10)
        assert seen == [(None, None)]  # listening: forget whatever was cached while deaf
        async with store.cross_tenant() as session:
            await create_tenant(session, "acme")
        async with store.tenant("acme") as session:
            key = await issue_api_key(session, "acme")
            agent = await create_agent(session, "bot", model="m", environment="toolbox")
            adapter = Adapter(agent_id=agent.id, name="bot--x--v1", base_model="m")
            session.add(adapter)
        async with store.tenant("acme") as session:
            revoked = await revoke_api_key(session, key[:16])
        async with store.tenant("acme") as session:
            row = await session.get(Agent, agent.id)
            assert row is not None
            row.production_adapters = [str(adapter.id)]
        async with store.tenant("acme") as session:
            await session.execute(delete(Adapter).where(Adapter.id == adapter.id))
        wanted = [
            ("api_keys", str(revoked.id)),
            ("agents", str(agent.id)),
            ("adapters", str(adapter.id)),
        ]
        await until(lambda: seen[1:] == wanted, within=10)
        assert set(theirs) == {(None, None)}  # another schema's feed heard none of ours
        generation = feed.generation

        # the feed's connection dies: deaf at once (within a check), then back, forgetting all
        conn = await asyncpg.connect(asyncpg_dsn(store.engine.url))
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = $1",
                feed.application_name,
            )
        finally:
            await conn.close()
        await until(lambda: feed.generation > generation, within=10)
        await until(lambda: feed.live and seen[-1] == (None, None), within=10)
    finally:
        await feed.close()
        await other.close()
    assert not feed.live
    await asyncio.sleep(0)  # nothing left running
    assert uuid.UUID(seen[1][1] or "")  # ids are row ids
