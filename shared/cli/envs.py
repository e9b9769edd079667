"""`retrace env list` and `retrace env check`: the environments that can be named, built in and
installed by packages, and whether one keeps the protocol's promises."""

from __future__ import annotations

import asyncio
from collections import Counter

import click
from rich.table import Table

from shared.cli.context import load_settings, make_console
from shared.envs import conformance
from shared.envs.registry import available, canonical, get_environment
from shared.envs.remote.client import is_http_ref
from shared.errors import PermanentError, RetryableError

console = make_console()


@click.group("env")
def env() -> None:
    """Environments: built-in ones and those installed packages declare."""


@env.command("list")
def env_list() -> None:
    """Every environment with its origin and task counts per split; one that cannot be loaded
    is listed with the reason."""
    load_settings()  # where an HTTP environment may be reached, as the services reach it
    try:
        names = available()
    except PermanentError as exc:
        raise click.ClickException(str(exc)) from exc
    table = Table(title="environments")
    for col in ("name", "from", "tasks", "train", "test", "status"):
        table.add_column(col)
    for name, where in sorted(names.items()):
        try:
            splits = Counter(task.split for task in get_environment(name).tasks())
        except (PermanentError, RetryableError) as exc:
            table.add_row(name, where, "", "", "", f"[red]unavailable[/red]: {exc}")
            continue
        total = sum(splits.values())
        table.add_row(name, where, str(total), str(splits["train"]), str(splits["test"]), "ok")
    console.print(table)


@env.command("check")
@click.argument("name")
def env_check(name: str) -> None:
    """Load one environment and run every conformance check on it (an async reset included)."""
    load_settings()  # where an HTTP environment may be reached, as the services reach it
    name = canonical(name)
    try:
        where = available().get(name) or ("over HTTP" if is_http_ref(name) else "retrace")
        tasks = asyncio.run(conformance.acheck(get_environment(name), where))
    except (PermanentError, RetryableError) as exc:
        raise click.ClickException(str(exc)) from exc
    splits = Counter(task.split for task in tasks)
    console.print(
        f"environment [bold]{name}[/bold] ({where}): ok, {len(tasks)} tasks "
        f"({splits['train']} train, {splits['test']} test)"
    )


@env.command("serve")
@click.argument("name")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=int)
def env_serve(name: str, host: str, port: int) -> None:
    """Serve an environment over the HTTP environment protocol (docs/environments.md); an
    agent then names it by URL: `--env http://HOST:PORT`."""
    from aiohttp import web

    from shared.envs.remote.server import environment_app

    load_settings()  # a URL served on is reached as the services reach it
    try:
        app = environment_app(get_environment(canonical(name)))
    except (PermanentError, RetryableError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(f"serving {name} on http://{host}:{port}/v1 (Ctrl-C stops)")
    web.run_app(app, host=host, port=port, print=None)
