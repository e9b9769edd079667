"""`retrace`: run the services, inspect them, and manage tenants and agents."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import signal
import sys
import time

import click
import msgspec
from rich.table import Table

from shared.cli import context
from shared.cli.admin import DEFAULT_TENANT, agent, migrate, tenant
from shared.cli.capabilities import capabilities, diagnose
from shared.cli.context import (
    SERVICES,
    RunState,
    load_settings,
    make_console,
    open_store,
    read_state,
    urls,
)
from shared.cli.control import admin_key_path, make_admin_key
from shared.cli.demo import demo
from shared.cli.envs import env
from shared.cli.failures import unreachable
from shared.cli.improve import improve, report
from shared.cli.rollout import rollout
from shared.cli.routing import routing_pack
from shared.cli.serve import model_gate, serve_model
from shared.cli.status import Report, collect
from shared.cli.supervisor import MODEL, MODEL_PORT, Supervisor, child_env
from shared.cli.synthesize import synthesize
from shared.cli.train import adapters, train
from shared.cli.work import bar, cancel_command
from shared.config import ServiceConfig
from shared.embedded import pid_alive, stop_embedded
from shared.errors import ConfigError
from shared.logging import configure_logging, redact
from shared.serving.model_files import resolve_model
from shared.serving.packaged import DEFAULT_AGENT_MODEL
from shared.store import migrate as migrations
from shared.store.tenants import create_tenant, list_tenants

console = make_console()
err = make_console(stderr=True)


def _fail(message: str) -> None:
    raise click.ClickException(message)


class _Retrace(click.Group):
    """The command group: a server out of reach is one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # the CLI's boundary: what is not a server out of reach re-raises
            message = None if ctx.params.get("debug") else unreachable(exc)
            if message is None:
                raise
            raise click.ClickException(message) from exc


@click.group(cls=_Retrace)
@click.version_option(package_name="retrace")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
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
@click.option(
    "--model",
    "model",
    default="auto",
    show_default=True,
    help="Serve a model beside the services: 'auto' serves Qwen2.5-Coder-0.5B-Instruct (the "
    "packaged default) unless RETRACE_MODEL_URL is "
    "set or torch is missing; 'none' never; anything else is served (e.g. a model directory).",
)
def up(only: tuple[str, ...], port_offset: int, ready_timeout: float, model: str) -> None:
    """Start the services (all, or --only some) and keep them running until Ctrl-C / SIGTERM.

    With no RETRACE_NATS_URL / RETRACE_DATABASE_URL, embedded NATS and Postgres are started
    under the data directory (RETRACE_STORAGE_DATA_DIR, default ./.retrace). With no
    RETRACE_MODEL_URL, `retrace serve-model` runs beside them (see --model)."""
    cfg = load_settings()
    configure_logging(cfg.log.level, cfg.log.format)
    existing = read_state(cfg)
    if existing is not None and pid_alive(existing.pid):
        _fail(f"`retrace up` is already running (pid {existing.pid}) for {cfg.storage.data_path}")
    served = _model_to_serve(model)
    if served is not None and importlib.util.find_spec("transformers") is not None:
        # a packaged model is converted once, minutes on a fresh 2-core machine: before the
        # services start, so that wait is not counted against --ready-timeout (a fresh
        # machine's `up` gave up on its model server while it was still converting)
        with console.status(f"preparing the model {served} (converted once, then cached)"):
            try:
                resolve_model(served)
            except ConfigError as exc:
                _fail(str(exc))
    with console.status("starting NATS and Postgres"):
        nats_url, db_url = urls(cfg, start=True)
        assert nats_url and db_url
    with console.status("migrating the database"):
        migrations.upgrade(db_url, cfg.database.schema)
        asyncio.run(_ensure_default_tenant(cfg))
    chosen = {name: SERVICES[name] + port_offset for name in (only or SERVICES)}
    if served is not None:
        chosen[MODEL] = MODEL_PORT + port_offset
    state = RunState(
        pid=os.getpid(),
        nats_url=nats_url,
        database_url=db_url,
        schema=cfg.database.schema,
        services=chosen,
    )
    context.write_state(cfg, state)
    try:
        code = asyncio.run(_run_supervisor(cfg, state, ready_timeout, served))
    finally:
        context.state_path(cfg).unlink(missing_ok=True)
        admin_key_path(cfg).unlink(missing_ok=True)
        if cfg.nats.url is None or cfg.database.url is None:
            stopped = stop_embedded(cfg.storage.data_path)
            console.print("stopped embedded " + (", ".join(stopped) or "servers"))
    sys.exit(code)


async def _ensure_default_tenant(cfg: ServiceConfig) -> None:
    async with open_store(cfg) as store, store.cross_tenant() as session:
        if not [t for t in await list_tenants(session) if t.id == DEFAULT_TENANT]:
            await create_tenant(session, DEFAULT_TENANT, "Default tenant")


def _model_to_serve(choice: str) -> str | None:
    """Which model `up` serves itself, if any."""
    if choice == "none":
        return None
    if choice != "auto":
        return choice
    if "RETRACE_MODEL_URL" in os.environ:
        return None  # the services use that endpoint
    if importlib.util.find_spec("torch") is None:
        err.print("[yellow]no model served: torch is missing (pip install -e '.[train]')")
        return None
    return DEFAULT_AGENT_MODEL


async def _run_supervisor(
    cfg: ServiceConfig, state: RunState, ready_timeout: float, served: str | None
) -> int:
    env = child_env(state.nats_url, state.database_url)
    env["RETRACE_DATABASE_SCHEMA"] = cfg.database.schema
    if not env.get("RETRACE_API_ADMIN_KEY"):
        # the operator's key for the control API, which the CLI's agent and cycle commands use
        env["RETRACE_API_ADMIN_KEY"] = make_admin_key(cfg)
    if served is not None:
        env["RETRACE_MODEL_URL"] = f"http://127.0.0.1:{state.services[MODEL]}/v1"
        # one key for the model server this `up` starts and every service that calls it,
        # and one for changing its adapters (the services that load them have it too)
        env.setdefault("RETRACE_MODEL_API_KEY", secrets.token_urlsafe(24))
        env.setdefault("RETRACE_MODEL_ADMIN_KEY", secrets.token_urlsafe(24))
    sup = Supervisor(state.services, env, cfg.storage.data_path / "logs", model=served)
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
    # both may carry a password (compose's NATS has one): never on the screen
    console.print(redact(f"NATS {state.nats_url}  Postgres {state.database_url}"))
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
    if state is not None and not pid_alive(state.pid):
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
    for a in report.active:
        console.print(
            f"  {a.tenant}/{a.agent}: {a.state} ({a.trigger}, {a.age_s:.0f}s in this stage) "
            f"cycle {a.cycle}"
        )
    if report.work:
        console.print("running jobs (`retrace cancel ID` stops one):")
    for w in report.work:
        console.print(f"  {w.tenant} {w.id}  {bar(w)}", markup=False, highlight=False)
    for e in report.errors:
        err.print(f"[yellow]{e}")


@cli.command()
def down() -> None:
    """Stop a running `retrace up` and the embedded NATS and Postgres of the data directory."""
    cfg = load_settings()
    state = read_state(cfg)
    stopped = []
    if state is not None and pid_alive(state.pid):
        os.kill(state.pid, signal.SIGTERM)
        _wait_gone(state.pid, 60)
        # it stops the services and the embedded servers it started itself
        stopped.append(
            f"retrace up (pid {state.pid})" + (", still stopping" if pid_alive(state.pid) else "")
        )
    stopped += stop_embedded(cfg.storage.data_path)
    console.print("stopped: " + (", ".join(stopped) or "nothing was running"))


# -- helpers ----------------------------------------------------------------------------------
def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)


for command in (
    rollout,
    diagnose,
    capabilities,
    synthesize,
    train,
    adapters,
    improve,
    report,
    demo,
    serve_model,
    model_gate,
    migrate,
    tenant,
    agent,
    env,
    routing_pack,
    cancel_command,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="retrace")


if __name__ == "__main__":
    main()
