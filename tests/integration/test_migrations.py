"""Alembic: a fresh database goes to head and back to base; models and migrations agree."""

from __future__ import annotations

import asyncio
import sys
import uuid

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from services.evaluator.state import load
from shared.config import DatabaseConfig
from shared.store import Store
from shared.store.engine import async_url
from shared.store.migrate import alembic_config, downgrade_async, upgrade_async
from shared.store.models import Agent, Base, Cycle

TABLES = {
    "tenants",
    "api_keys",
    "agents",
    "environments",
    "tasks",
    "cycles",
    "trajectories",
    "capabilities",
    "adapters",
    "training_jobs",
    "evaluations",
    "processed_messages",
    "conversations",
    "work",
}


async def _tables(url: str, schema: str) -> set[str]:
    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names(schema=schema)))
    finally:
        await engine.dispose()


async def test_upgrade_then_downgrade(database_url: str, schema: str) -> None:
    await upgrade_async(database_url, schema)
    assert await _tables(database_url, schema) == TABLES | {"alembic_version"}
    await upgrade_async(database_url, schema)  # idempotent
    await downgrade_async(database_url, schema, "base")
    assert await _tables(database_url, schema) == {"alembic_version"}
    await upgrade_async(database_url, schema)
    assert await _tables(database_url, schema) >= TABLES


async def test_every_table_carries_tenant_id(database_url: str, migrated: str) -> None:
    engine = create_async_engine(async_url(database_url))
    async with engine.connect() as conn:

        def columns(c):  # type: ignore[no-untyped-def]
            insp = inspect(c)
            return {
                t: {col["name"] for col in insp.get_columns(t, schema=migrated)} for t in TABLES
            }

        cols = await conn.run_sync(columns)
    await engine.dispose()
    for table, names in cols.items():
        assert ("tenant_id" in names) or table == "tenants", table


async def test_models_match_migrations(database_url: str, migrated: str) -> None:
    engine = create_async_engine(
        async_url(database_url), connect_args={"server_settings": {"search_path": migrated}}
    )
    async with engine.connect() as conn:
        diff = await conn.run_sync(
            lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata)
        )
    await engine.dispose()
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


async def test_concurrent_upgrades_do_not_collide(database_url: str, schema: str) -> None:
    # Every embedded service migrates at start, each in its own process: the advisory lock in
    # env.py serialises them, so none fails on a half-created table.
    code = f"from shared.store.migrate import upgrade; upgrade({database_url!r}, {schema!r})"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE
        )
        for _ in range(3)
    ]
    for proc in procs:
        _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()[-2000:]
    await asyncio.gather(*(upgrade_async(database_url, schema) for _ in range(2)))
    engine = create_async_engine(async_url(database_url))
    async with engine.connect() as conn:
        version = await conn.scalar(text(f'SELECT version_num FROM "{schema}".alembic_version'))
    await engine.dispose()
    assert version == ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


async def test_0004_moves_a_flat_cycle_s_data_by_stage_and_back(
    database_url: str, schema: str
) -> None:
    """A cycle written before 0004 (one flat bag, `route:` prefixes) reads as typed data
    after it, and the downgrade gives the flat bag back."""
    await upgrade_async(database_url, schema, "0003")
    store = Store.connect(DatabaseConfig(schema=schema, pool_size=2), database_url)
    try:
        async with store.cross_tenant() as session:
            # by hand: the ORM's tenant has columns added after 0003 (its quotas)
            await session.execute(text("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')"))
        job, adapter, base, route = (str(uuid.uuid4()) for _ in range(4))
        flat = {
            "settings": {"seed": 3},
            "diagnosis": str(uuid.uuid4()),
            "jobs": {job: adapter},
            "baseline_jobs": {},
            "training_failures": {},
            "evaluations": {"base": base, "route:base": route},
            "evaluated": ["base"],
            "adapters": [adapter],
            "production": [],
        }
        async with store.tenant("acme") as session:
            agent = Agent(name="bot", model="smollm2", environment="toolbox")
            session.add(agent)
            await session.flush()
            row = Cycle(agent_id=agent.id, state="evaluating", data=flat)
            session.add(row)
            await session.flush()
            cycle_id = row.id

        async def stored() -> Cycle:
            async with store.tenant("acme") as session:
                found = await session.get(Cycle, cycle_id)
                assert found is not None
                return found

        await upgrade_async(database_url, schema)
        data = load(await stored())
        assert data.settings.seed == 3
        assert data.training is not None and data.training.jobs == {job: adapter}
        assert data.evaluation is not None
        assert data.evaluation.requests == {"base": base}
        assert data.evaluation.route_requests == {"base": route}
        assert data.evaluation.done == [base] and not data.evaluation.complete()
        await downgrade_async(database_url, schema, "0003")
        assert (await stored()).data == flat
    finally:
        await store.close()


async def test_0010_makes_old_keys_all_and_going_back_revokes_the_scoped(
    database_url: str, schema: str
) -> None:
    """Keys made before scopes keep doing everything; going back below 0010 revokes the
    scoped ones (without the column they would do everything)."""
    await upgrade_async(database_url, schema, "0009")
    store = Store.connect(DatabaseConfig(schema=schema, pool_size=2), database_url)
    try:
        async with store.cross_tenant() as session:
            await session.execute(text("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')"))
            await session.execute(
                text(
                    "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash) VALUES "
                    "(gen_random_uuid(), 'acme', 'old', 'rt_acme_old', 'h-old')"
                )
            )
        await upgrade_async(database_url, schema)

        async def keys() -> dict[str, bool]:
            async with store.cross_tenant() as session:
                rows = await session.execute(
                    text("SELECT name, revoked_at IS NULL FROM api_keys ORDER BY name")
                )
                return {name: live for name, live in rows}

        async with store.cross_tenant() as session:
            assert (await session.execute(text("SELECT scope FROM api_keys"))).scalar() == "all"
            await session.execute(
                text(
                    "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, scope) VALUES "
                    "(gen_random_uuid(), 'acme', 'app', 'rt_acme_app', 'h-app', 'inference')"
                )
            )
        await downgrade_async(database_url, schema, "0009")
        assert await keys() == {"app": False, "old": True}
    finally:
        await store.close()


async def test_0011_finishes_a_run_cut_short_in_its_concurrent_index_build(
    database_url: str, schema: str
) -> None:
    """0011 builds its index CONCURRENTLY, outside the migration's transaction: a run cut
    short there has committed the column and left an invalid index of that name, and the
    next run drops it, builds it again and moves the version on."""
    await upgrade_async(database_url, schema, "0010")
    engine = create_async_engine(
        async_url(database_url),
        connect_args={"server_settings": {"search_path": schema}},
        isolation_level="AUTOCOMMIT",
    )
    index = "ix_conversations_tenant_id_branch_of"
    try:
        async with engine.connect() as conn:
            await conn.execute(text("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')"))
            agent = await conn.scalar(
                text(
                    "INSERT INTO agents (id, tenant_id, name, model, environment, system_prompt, "
                    "config, production_adapters) VALUES "
                    "(gen_random_uuid(), 'acme', 'bot', 'm', 'toolbox', '', '{}', '[]') "
                    "RETURNING id"
                )
            )
            branched = str(uuid.uuid4())
            for tip in ("a", "b"):
                await conn.execute(
                    text(
                        "INSERT INTO conversations (id, tenant_id, agent_id, tip, route, turns) "
                        "VALUES (gen_random_uuid(), 'acme', :agent, :tip, "
                        "jsonb_build_object('branch_of', CAST(:of AS text)), 1)"
                    ),
                    {"agent": agent, "tip": tip, "of": branched},
                )
            # what the cut-short run left: the column, filled, and an index that failed
            # (a unique build over the two rows that share a branch_of fails and stays, invalid)
            await conn.execute(text("ALTER TABLE conversations ADD COLUMN branch_of uuid"))
            await conn.execute(
                text("UPDATE conversations SET branch_of = CAST(:of AS uuid)"), {"of": branched}
            )
            try:
                await conn.execute(
                    text(
                        f"CREATE UNIQUE INDEX CONCURRENTLY {index} "
                        "ON conversations (tenant_id, branch_of)"
                    )
                )
            except Exception as e:  # noqa: BLE001 - the failure is the point
                assert "could not create unique index" in str(e)
            else:
                raise AssertionError("the unique build should have failed")

            async def state() -> list[tuple[bool, bool]]:
                rows = await conn.execute(
                    text(
                        "SELECT i.indisvalid, i.indisunique FROM pg_index i "
                        "JOIN pg_class c ON c.oid = i.indexrelid "
                        "WHERE c.relname = :name AND c.relnamespace = CAST(:schema AS regnamespace)"
                    ),
                    {"name": index, "schema": schema},
                )
                return [tuple(row) for row in rows]

            assert await state() == [(False, True)]
            await upgrade_async(database_url, schema, "0011")
            assert await state() == [(True, False)]
            version = await conn.scalar(text("SELECT version_num FROM alembic_version"))
            assert version == "0011"
            moved = await conn.scalar(
                text("SELECT count(*) FROM conversations WHERE branch_of = CAST(:of AS uuid)"),
                {"of": branched},
            )
            assert moved == 2
    finally:
        await engine.dispose()


def test_0011_builds_its_index_concurrently_outside_the_transaction() -> None:
    """The SQL 0011 runs (Alembic's offline mode): after the migration's transaction has been
    committed, each statement on its own (the column, the backfill, the index CONCURRENTLY),
    so routers keep writing meanwhile; the version moves in a transaction after them."""
    import contextlib
    import io

    from alembic import command

    out = io.StringIO()
    config = alembic_config("postgresql://u@h/d")
    config.output_buffer = out
    with contextlib.redirect_stdout(out):
        command.upgrade(config, "0010:0011", sql=True)
    sql = out.getvalue()
    steps = [
        "COMMIT;",
        "ALTER TABLE conversations ADD COLUMN IF NOT EXISTS branch_of uuid;",
        "UPDATE conversations SET branch_of",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_conversations_tenant_id_branch_of",
        "BEGIN;",
        "UPDATE alembic_version SET version_num='0011'",
    ]
    at = [sql.index(step, sql.index("Running upgrade 0010 -> 0011")) for step in steps]
    assert at == sorted(at), sql
    between = sql[at[0] + len(steps[0]) : at[4]]
    assert "BEGIN" not in between and "COMMIT" not in between, sql


async def test_a_schema_with_a_dot_in_its_name_migrates_to_head(database_url: str) -> None:
    # 0011's check for an invalid index once cast current_schema() to regnamespace, which
    # reads a dot as a qualifier ("invalid name syntax")
    name = f"t.{uuid.uuid4().hex[:12]}"
    try:
        await upgrade_async(database_url, name)
        assert await _tables(database_url, name) == TABLES | {"alembic_version"}
    finally:
        engine = create_async_engine(async_url(database_url))
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        await engine.dispose()
