"""`retrace migrate`, `retrace tenant ...`, `retrace agent ...`: the control plane."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import click
import msgspec
from rich.table import Table

from shared.cli.context import load_settings, make_console, open_store, urls
from shared.cli.control import ControlApi, given
from shared.envs.registry import canonical
from shared.errors import PermanentError
from shared.store import migrate as migrations
from shared.store import quotas
from shared.store.models import Tenant
from shared.store.tenants import (
    SCOPES,
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
@click.option(
    "--scope",
    type=click.Choice(list(SCOPES)),
    default="all",
    show_default=True,
    help="What the key may do: inference (the router only: an application's key), read "
    "(the control API's reads and the console), all (every route, keys included).",
)
def key_create(tenant_id: str, name: str, scope: str) -> None:
    """Issue another key (shown once, stored hashed)."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return await issue_api_key(session, tenant_id, name, scope)

    key = _run(run())
    console.print(f"scope {scope}: {SCOPES[scope]}")
    console.print(f"API key (shown once): {key}")


@tenant_key.command("list")
@click.argument("tenant_id")
def key_list(tenant_id: str) -> None:
    """The tenant's keys by id and prefix (the keys themselves are not stored)."""
    cfg = load_settings()

    async def run() -> list[tuple[str, str, str, str, str, str]]:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            return [
                (
                    str(k.id),
                    k.prefix,
                    k.name,
                    k.scope,
                    k.created_at.isoformat(),
                    k.revoked_at.isoformat() if k.revoked_at else "-",
                )
                for k in await list_api_keys(session)
            ]

    table = Table(title=f"API keys of {tenant_id}")
    for col in ("id", "prefix", "name", "scope", "created", "revoked"):
        table.add_column(col)
    for row in _run(run()):
        table.add_row(*row)
    console.print(table)


@tenant_key.command("revoke")
@click.argument("tenant_id")
@click.argument("key")
def key_revoke(tenant_id: str, key: str) -> None:
    """Revoke a key, named by its id (from `key list`), the whole key or its first
    characters: refused from the next request."""
    cfg = load_settings()

    async def run() -> str:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            row = await revoke_api_key(session, key)
            return f"{row.id} ({row.prefix}...)"

    console.print(f"revoked {_run(run())}")


@tenant_key.command("rotate")
@click.argument("tenant_id")
@click.argument("key")
def key_rotate(tenant_id: str, key: str) -> None:
    """Issue a new key with the old one's name and scope and revoke the old one (named as
    `revoke` takes it), in one step."""
    cfg = load_settings()

    async def run() -> tuple[str, str]:
        async with open_store(cfg) as store, store.tenant(tenant_id) as session:
            old = await revoke_api_key(session, key)
            new = await issue_api_key(session, tenant_id, old.name, old.scope)
            return f"{old.id} ({old.prefix}...)", new

    old, new = _run(run())
    console.print(f"revoked {old}; new API key (shown once): {new}")


@tenant.command("list")
def tenant_list() -> None:
    """List tenants."""
    cfg = load_settings()

    async def run() -> list[tuple[str, str, str, str]]:
        async with open_store(cfg) as store, store.cross_tenant() as session:
            return [
                (t.id, t.name, t.created_at.isoformat(), _limits(quotas.parse(t.quotas)))
                for t in await list_tenants(session)
            ]

    table = Table(title="tenants")
    for col in ("id", "name", "created", "quotas"):
        table.add_column(col)
    for row in _run(run()):
        table.add_row(*row)
    console.print(table)


class _Limit(click.ParamType):
    """A quota: a whole number, or `none` for no limit."""

    name = "N|none"
    wrong = "is not a whole number or 'none'"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> object:
        if value is None or isinstance(value, (int, float)) or value == UNLIMITED:
            return value  # a default, or converted already
        text = str(value).strip().lower()
        if text == "none":
            return UNLIMITED
        number = self.number(text)
        if number is None:
            self.fail(f"{value!r} {self.wrong}", param, ctx)
        return number

    def number(self, text: str) -> int | float | None:
        return int(text) if text.isascii() and text.isdigit() else None


class _Rate(_Limit):
    """A request rate: requests a second (a decimal), or `none` for the router's default."""

    name = "R|none"
    wrong = "is not a positive number of requests a second or 'none'"

    def number(self, text: str) -> int | float | None:
        try:
            rate = float(text)
        except ValueError:
            return None
        return rate if math.isfinite(rate) and rate > 0 else None


UNLIMITED = "none"


@tenant.command("quota")
@click.argument("tenant_id")
@click.option("--max-agents", type=_Limit(), help="Agents it may have.")
@click.option("--max-active-cycles", type=_Limit(), help="Cycles it may run at once.")
@click.option("--max-cycles-per-day", type=_Limit(), help="Cycles it may start in 24 hours.")
@click.option(
    "--requests-per-s",
    type=_Rate(),
    help="Chat requests a second through the router, all its processes together "
    "(none: the router's RETRACE_ROUTER_TENANT_RATE).",
)
@click.option(
    "--request-burst",
    type=_Limit(),
    help="Chat requests at once after a pause (none: RETRACE_ROUTER_TENANT_BURST).",
)
@click.option(
    "--tokens-per-min",
    type=_Limit(),
    help="Tokens a minute through the router, a request counted as its prompt's characters "
    "/ 4 plus n x max_tokens (none: RETRACE_ROUTER_TENANT_TOKENS_PER_MIN).",
)
def tenant_quota(tenant_id: str, **given: float | int | str | None) -> None:
    """Show a tenant's quotas and usage; with options, change those named first (`none`: no
    limit, or the router's default for the request rate). A request over a quota is refused,
    saying which (the API and the router answer 429)."""
    cfg = load_settings()
    changes = {name: None if v == UNLIMITED else v for name, v in given.items() if v is not None}

    async def run() -> tuple[quotas.Quotas, quotas.Usage]:
        async with open_store(cfg) as store:
            async with store.cross_tenant() as session:
                tenant = await session.get(Tenant, tenant_id)
                if tenant is None:
                    raise PermanentError(f"no tenant {tenant_id!r} (`retrace tenant list`)")
                if changes:  # checked whole, stored values included (one set by hand, mended)
                    try:
                        limits = msgspec.convert(
                            {**(tenant.quotas or {}), **changes}, quotas.Quotas
                        )
                    except msgspec.ValidationError as exc:
                        raise PermanentError(f"quotas not set: {exc}") from None
                    await quotas.set_quotas(session, tenant_id, limits)
                else:
                    limits = quotas.parse(tenant.quotas)
            async with store.tenant(tenant_id) as session:
                return limits, await quotas.usage(session)

    limits, used = _run(run())
    table = Table(title=f"quotas of {tenant_id}")
    for col in ("quota", "limit", "used"):
        table.add_column(col)
    for name, count in (
        ("max_agents", str(used.agents)),
        ("max_active_cycles", str(used.active_cycles)),
        ("max_cycles_per_day", str(used.cycles_last_day)),
        ("requests_per_s", "-"),  # counted by the routers, in memory
        ("request_burst", "-"),
        ("tokens_per_min", "-"),
    ):
        limit = getattr(limits, name)
        routers = name.startswith(("request", "tokens"))
        unset = "default" if routers else "none"  # the router's own
        shown = unset if limit is None else str(limit)
        table.add_row(name, shown, count)
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
    """Register an agent for a tenant (through the control API)."""
    body = {
        "name": name,
        "model": model,
        "environment": canonical(environment),  # an mcp: file, absolute from here
        "system_prompt": prompt_file.read_text(encoding="utf-8") if prompt_file else "",
    }
    client = _client(tenant_id)
    made = _api(client, lambda api: api.call("POST", "/v1/agents", body))
    console.print(f"agent [bold]{name}[/bold] created for tenant {client.tenant} ({made['id']})")


@agent.command("update")
@click.argument("name")
@click.option(
    "--tenant", "tenant_id", default=DEFAULT_TENANT, envvar="RETRACE_TENANT", show_default=True
)
@click.option("--model", default=None, help="A new base model.")
@click.option("--env", "environment", default=None, help="A new target environment.")
@click.option(
    "--prompt",
    "prompt_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the new system prompt.",
)
def agent_update(
    name: str,
    tenant_id: str,
    model: str | None,
    environment: str | None,
    prompt_file: Path | None,
) -> None:
    """Change an agent's model, environment or system prompt (only those given)."""
    change: dict[str, str] = {}
    if model is not None:
        change["model"] = model
    if environment is not None:
        change["environment"] = canonical(environment)
    if prompt_file is not None:
        change["system_prompt"] = prompt_file.read_text(encoding="utf-8")
    if not change:
        raise click.UsageError("nothing to change: give --model, --env or --prompt")
    client = _client(tenant_id)
    _api(client, lambda api: api.call("PATCH", f"/v1/agents/{_segment(name)}", change))
    console.print(f"agent [bold]{name}[/bold] of {client.tenant} updated: {', '.join(change)}")


@agent.command("list")
@click.option(
    "--tenant", "tenant_id", default=DEFAULT_TENANT, envvar="RETRACE_TENANT", show_default=True
)
def agent_list(tenant_id: str) -> None:
    """List a tenant's agents."""
    client = _client(tenant_id)
    agents = _api(client, lambda api: api.every("/v1/agents"))
    table = Table(title=f"agents of {client.tenant}")
    for col in ("name", "model", "environment", "adapters serving", "created"):
        table.add_column(col)
    for a in sorted(agents, key=lambda a: a["name"]):
        serving = str(len(a["production_adapters"]))
        table.add_row(a["name"], a["model"], a["environment"], serving, a["created_at"])
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
    client = _client(tenant_id)
    if not yes:
        click.confirm(f"delete agent {name!r} of {client.tenant} and all it recorded?", abort=True)
    _api(client, lambda api: api.call("DELETE", f"/v1/agents/{_segment(name)}"))
    console.print(f"agent [bold]{name}[/bold] of {client.tenant} deleted")


def _client(tenant_id: str) -> ControlApi:
    """The control API, acting for `tenant_id` (or for the tenant whose key is set)."""
    return ControlApi.connect(load_settings(), tenant_id, explicit=given("tenant_id"))


def _api(client: ControlApi, action: Callable[[ControlApi], Awaitable[T]]) -> T:
    """Run one tenant-level action through the control API."""

    async def run() -> T:
        async with client as api:
            return await action(api)

    return asyncio.run(run())


def _segment(name: str) -> str:
    return quote(name, safe="")


def _limits(limits: quotas.Quotas) -> str:
    """The quotas set, as `name=N` pairs ("-" when none is)."""
    set_ = {k: v for k, v in msgspec.structs.asdict(limits).items() if v is not None}
    return ", ".join(f"{k.removeprefix('max_')}={v}" for k, v in set_.items()) or "-"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; expected failures become one clear line, not a traceback."""
    try:
        return asyncio.run(coro)
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
