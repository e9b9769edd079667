"""What every CLI command needs: settings, URLs of a running deployment, a store."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import click
import msgspec
from rich.console import Console

from shared.config import ServiceConfig, load_config
from shared.embedded import ensure_nats, ensure_postgres, postgres_running, stop_postgres
from shared.errors import UNDECODABLE, ConfigError
from shared.runtime.files import write_private
from shared.store import Store
from shared.store.migrate import upgrade_async

SERVICES: dict[str, int] = {
    "rollout": 8101,
    "contrast": 8102,
    "synthesize": 8103,
    "train": 8104,
    "evaluator": 8105,
    "router": 8080,
    "api": 8090,
}
"""Every service and its default HTTP port."""


class RunState(msgspec.Struct, kw_only=True):
    """`<data_dir>/run/up.json`: what `retrace up` started, for `status` and `down`."""

    pid: int
    nats_url: str
    database_url: str
    schema: str
    services: dict[str, int]
    """name -> HTTP port"""
    host: str = "127.0.0.1"


def make_console(stderr: bool = False) -> Console:
    """A rich console; when output goes to a file or pipe, wide enough not to cut table cells."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def load_settings() -> ServiceConfig:
    """The deployment's settings; this process's connections to environments follow them
    (`EnvironmentsConfig.apply`), as every service's do."""
    try:
        cfg = load_config(ServiceConfig, service="cli")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    cfg.environments.apply()
    return cfg


def state_path(cfg: ServiceConfig) -> Path:
    return cfg.storage.data_path / "run" / "up.json"


def read_state(cfg: ServiceConfig) -> RunState | None:
    path = state_path(cfg)
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunState)
    except UNDECODABLE:
        return None


def write_state(cfg: ServiceConfig, state: RunState) -> None:
    path = state_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    # its URLs carry passwords (the embedded NATS's, a configured one's): its owner's alone
    write_private(path, json.dumps(msgspec.to_builtins(state), indent=2))


def urls(cfg: ServiceConfig, *, start: bool) -> tuple[str | None, str | None]:
    """Configured URLs, else those of a running `retrace up`, else (if `start`) embedded ones."""
    state = read_state(cfg)
    nats_url = cfg.nats.url or (state.nats_url if state else None)
    db_url = cfg.database.url or (state.database_url if state else None)
    if start:
        nats_url = nats_url or ensure_nats(cfg.storage.data_path)
        db_url = db_url or ensure_postgres(cfg.storage.data_path)
    return nats_url, db_url


@asynccontextmanager
async def open_store(cfg: ServiceConfig) -> AsyncIterator[Store]:
    """The configured database, else the running `retrace up`'s, else the data directory's
    embedded Postgres, brought to the schema's head (a fresh one has no tables) and, when
    this command started it, stopped after it: a command starts nothing it does not stop."""
    _, db_url = urls(cfg, start=False)
    started = False
    if db_url is None:
        data = cfg.storage.data_path
        started = not postgres_running(data)
        db_url = ensure_postgres(data)
        await upgrade_async(db_url, cfg.database.schema)
    store = Store.connect(cfg.database, db_url)
    try:
        yield store
    finally:
        await store.close()
        if started:
            stop_postgres(cfg.storage.data_path)
