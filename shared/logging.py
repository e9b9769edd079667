"""structlog set-up: console output in a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure_logging(
    level: str = "info", fmt: LogFormat = "auto", service: str | None = None
) -> None:
    """Route structlog and stdlib logging through one pipeline writing to stderr."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        hide_secrets,
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(),
            # a frame's locals hold keys, request bodies and model output: never in a log
            exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False),
        )
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info if use_json else _identity,
                hide_secrets,  # again: a formatted traceback can carry a URL too
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter at INFO drowns the service's own lines.
    for noisy in ("asyncio", "aiohttp.access", "nats", "alembic", "sqlalchemy", "pgserver"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    if service:
        structlog.contextvars.bind_contextvars(service=service)


_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://[^/\s:@]*:)[^/\s@]+@")
"""`scheme://user:password@`: the password part of a URL's credentials."""


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`."""
    return _CREDENTIALS.sub(r"\g<scheme>***@", text)


def hide_secrets(
    _: object, __: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """No URL's password reaches a log line (a NATS or Postgres URL logged on disconnect or in
    an error), whatever field carries it."""
    return {k: _hidden(v) for k, v in event_dict.items()}


def _hidden(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value) if "@" in value else value
    if isinstance(value, list | tuple):
        return [_hidden(v) for v in value]
    if isinstance(value, dict):
        return {k: _hidden(v) for k, v in value.items()}
    return value


def _identity(
    _: object, __: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event_dict


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; `name` is usually the module's `__name__`."""
    return structlog.stdlib.get_logger(name)
