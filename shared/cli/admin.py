"""`retrace migrate`, `retrace tenant ...`, `retrace agent ...`: the control plane."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table

from shared.cli.context import load_settings, make_console, open_store, urls
from shared.envs.registry import canonical, get_environment
from shared.errors import PermanentError, RetryableError
from shared.store import migrate as migrations
from shared.store.agents import create_agent, delete_agent, list_agents
from shared.store.tenants import (
    create_tenant,
    delete_tenant,
    issue_api_key,
    list_api_keys,
    list_tenants,
    revoke_api_key,
)

console = make_console()
DEFAULT_TENANT = "default"
T = TypeVar("T")


@click.command()
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option("--downgrade", is_flag=True, help="Go down to --revision (e.g. base) instead of up.")
def migrate(revision: str, downgrade: bool) -> None:
    """Bring the database schema to a revision (Alembic)."""
    cfg = load_settings()
    _, db_url = urls(cfg, start=True)
    assert db_url is not None
    (migrations.downgrade if downgrade else migrations.upgrade)(
        db_url, cfg.database.schema, revision
    )
    console.print(f"database at {revision}")


@click.group()
def tenant() -> None:
    """Tenants and their API keys."""


@tenant.command("create")
@click.argument("tenant_id")
@click.option("--name", default=None, help="Display name.")
def tenant_create(tenant_id: str, name: str | None) -> None:
    """Create a tenant and print its first API key (shown once, stored hashed)."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store:
            async with store.cross_tenant() as session:
                await create_tenant(session, tenant_id, name)
            async with store.tenant(tenant_id) as session:
                return await issue_api_key(session, tenant_id)

    key = _run(run())
    console.print(f"tenant [bold]{tenant_id}[/bold] created")
    console.print(f"API key (shown once): {key}")


@tenant.group("key")
def tenant_key() -> None:
    """A tenant's API keys: create, list, revoke, rotate."""


@tenant_key.command("create")
@click.argument("tenant_id")
@click.option("--name", default="default", show_default=True, help="What the key is for.")
def key_create(tenant_id: str, name: str) -> None:
    """Issue another key (shown once, stored hashed)."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return await issue_api_key(session, tenant_id, name)

    console.print(f"API key (shown once): {_run(run())}")


@tenant_key.command("list")
@click.argument("tenant_id")
def key_list(tenant_id: str) -> None:
    """The tenant's keys by prefix (the keys themselves are not stored)."""
    cfg = load_settings()

    async def run() -> list[tuple[str, str, str, str]]:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return [
                (
                    k.prefix,
                    k.name,
                    k.created_at.isoformat(),
                    k.revoked_at.isoformat() if k.revoked_at else "-",
                )
                for k in await list_api_keys(session)
            ]

    table = Table(title=f"API keys of {tenant_id}")
    for col in ("prefix", "name", "created", "revoked"):
        table.add_column(col)
    for row in _run(run()):
        table.add_row(*row)
    console.print(table)


@tenant_key.command("revoke")
@click.argument("tenant_id")
@click.argument("prefix")
def key_revoke(tenant_id: str, prefix: str) -> None:
    """Revoke the key starting with PREFIX (from `key list`): refused from the next request."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return (await revoke_api_key(session, prefix)).prefix

    console.print(f"revoked {_run(run())}...")


@tenant_key.command("rotate")
@click.argument("tenant_id")
@click.argument("prefix")
def key_rotate(tenant_id: str, prefix: str) -> None:
    """Issue a new key with the old one's name and revoke the old one, in one step."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            old = await revoke_api_key(session, prefix)
            return await issue_api_key(session, tenant_id, old.name)

    key = _run(run())
    console.print(f"revoked {prefix[:16]}...; new API key (shown once): {key}")


@tenant.command("list")
def tenant_list() -> None:
    """List tenants."""
    cfg = load_settings()

    async def run() -> list[tuple[str, str, str]]:
        async with open_store(cfg) as store, store.cross_tenant() as session:
            return [(t.id, t.name, t.created_at.isoformat()) for t in await list_tenants(session)]

    table = Table(title="tenants")
    for col in ("id", "name", "created"):
        table.add_column(col)
    for row in _run(run()):
        table.add_row(*row)
    console.print(table)


@tenant.command("delete")
@click.argument("tenant_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def tenant_delete(tenant_id: str, yes: bool) -> None:
    """Delete a tenant with its keys, agents and everything they recorded (refused while a
    cycle or training job of it is in progress). Adapter files stay in the artifact store."""
    if not yes:
        click.confirm(f"delete tenant {tenant_id!r} and everything it has recorded?", abort=True)
    cfg = load_settings()

    async def run() -> None:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            await delete_tenant(session, tenant_id)

    _run(run())
    console.print(f"tenant [bold]{tenant_id}[/bold] deleted")


@click.group()
def agent() -> None:
    """Agents: a model, a system prompt and a target environment."""


@agent.command("create")
@click.argument("name")
@click.option(
    "--tenant", "tenant_id", default=DEFAULT_TENANT, envvar="RETRACE_TENANT", show_default=True
)
@click.option("--model", required=True, help="Base model name as the inference endpoint knows it.")
@click.option("--env", "environment", required=True, help="Target environment, e.g. toolbox.")
@click.option(
    "--prompt",
    "prompt_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the system prompt.",
)
def agent_create(
    name: str, tenant_id: str, model: str, environment: str, prompt_file: Path | None
) -> None:
    """Register an agent for a tenant."""
    cfg = load_settings()
    prompt = prompt_file.read_text(encoding="utf-8") if prompt_file else ""
    environment = canonical(environment)
    try:
        get_environment(environment)  # a name that cannot run fails now, not at rollout
    except (PermanentError, RetryableError) as exc:
        raise click.ClickException(str(exc)) from exc

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            created = await create_agent(
                session, name, model=model, environment=environment, system_prompt=prompt
            )
            return str(created.id)

    agent_id = _run(run())
    console.print(f"agent [bold]{name}[/bold] created for tenant {tenant_id} ({agent_id})")


@agent.command("list")
@click.option(
    "--tenant", "tenant_id", default=DEFAULT_TENANT, envvar="RETRACE_TENANT", show_default=True
)
def agent_list(tenant_id: str) -> None:
    """List a tenant's agents."""
    cfg = load_settings()

    async def run() -> list[tuple[str, str, str, str]]:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return [
                (a.name, a.model, a.environment, a.created_at.isoformat())
                for a in await list_agents(session)
            ]

    table = Table(title=f"agents of {tenant_id}")
    for col in ("name", "model", "environment", "created"):
        table.add_column(col)
    for row in _run(run()):
        table.add_row(*row)
    console.print(table)


@agent.command("delete")
@click.argument("name")
@click.option(
    "--tenant", "tenant_id", default=DEFAULT_TENANT, envvar="RETRACE_TENANT", show_default=True
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def agent_delete(name: str, tenant_id: str, yes: bool) -> None:
    """Delete an agent with its cycles, trajectories, capabilities and adapters' records
    (refused while it has a cycle or training job in progress). Adapter files stay in the
    artifact store."""
    if not yes:
        click.confirm(f"delete agent {name!r} of {tenant_id} and all it recorded?", abort=True)
    cfg = load_settings()

    async def run() -> None:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            await delete_agent(session, name)

    _run(run())
    console.print(f"agent [bold]{name}[/bold] of {tenant_id} deleted")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; expected failures become one clear line, not a traceback."""
    try:
        return asyncio.run(coro)
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
