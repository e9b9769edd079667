"""What the CLI says when a server it needs cannot be reached: one line naming the server,
the setting that points at it and what to do, instead of a traceback (`retrace --debug`
shows the traceback)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import TracebackType

from nats.errors import NoServersError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from shared.cli.context import load_settings
from shared.errors import ConfigError

UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError,
    socket.gaierror,
    TimeoutError,
    NoServersError,
)
"""Failures that say a server is down or not where the settings point."""


def unreachable(exc: BaseException) -> str | None:
    """The one line for `exc` when it (or what caused it) is a server out of reach; None for
    any other failure, which stays a traceback: a bug to report, not a setting to fix."""
    for error in _chain(exc):
        if not isinstance(error, UNREACHABLE):
            continue
        modules = {m.split(".")[0] for e in _chain(exc) for m in _modules(e.__traceback__)}
        if "asyncpg" in modules or "sqlalchemy" in modules:
            return _say("Postgres", "RETRACE_DATABASE_URL", _configured("database"), error)
        if "nats" in modules:
            return _say("NATS", "RETRACE_NATS_URL", _configured("nats"), error)
    return None


def _say(server: str, setting: str, url: str | None, error: BaseException) -> str:
    where = f"{setting}={url}" if url else f"{setting} unset (the running `retrace up`'s)"
    detail = str(error) or type(error).__name__
    return (
        f"cannot reach {server} ({where}): {detail}. Is it running? With no URL set, "
        f"`retrace up` starts an embedded one."
    )


def _configured(block: str) -> str | None:
    try:
        cfg = load_settings()
    except ConfigError:
        return None
    url = cfg.database.url if block == "database" else cfg.nats.url
    if not url:
        return None
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not a URL sqlalchemy reads: never shown, it may hold a password
        return "<set>"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _modules(tb: TracebackType | None) -> Iterator[str]:
    while tb is not None:
        yield str(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
