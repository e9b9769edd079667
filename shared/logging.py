"""structlog set-up: console output in a terminal, JSON lines otherwise."""

from __future__ import annotations

import io
import logging
import re
import sys
from typing import Any, Literal, TextIO

import structlog
from aiohttp.http_exceptions import HttpProcessingError

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
            colors=sys.stderr.isatty(), exception_formatter=_plain_redacted_traceback
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
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _NotHTTP) for f in server.filters):
        server.addFilter(_NotHTTP())
    if service:
        structlog.contextvars.bind_contextvars(service=service)


class _NotHTTP(logging.Filter):
    """aiohttp's line for a request that is not well-formed HTTP (a bad header, a line too
    long) was an ERROR whose message and traceback quote the bytes received, a key in an
    `Authorization` header included: it becomes a WARNING (the caller's fault) that says
    only what was wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "malformed HTTP request refused: %s (%s)"
            record.args = (type(exc).__name__, exc.code)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]{0,31}://[^/\s:@]*:)[^/\s\"'<>`{}|\\^]+@")
"""`scheme://user:password@`: the password part of a URL's credentials, to the last `@`
before the host (a password may hold one) that no quote or other character a URL never
holds unencoded comes before (a later address in the same JSON text). The scheme is bounded,
so a long run of letters is not scanned again from each of them."""
_TOKEN = re.compile(r"(?P<scheme>\b(?:nats|tls|wss?)://)[^/\s:@]+@")
"""`nats://token@`: NATS takes a URL's lone user part as a token."""
_BEARER = re.compile(r"(?P<scheme>\bbearer\s+)[^\s'\",;\\]+", re.IGNORECASE)
"""`Bearer <token>`: a key as an `Authorization` header carries it."""
_KEY = re.compile(r"(?P<tenant>\brt_[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?_)[A-Za-z0-9_-]{32}")
"""A tenant's API key (`shared.store.tenants.KEY_RE`): its tenant is kept, its secret not."""


def redact(text: str) -> str:
    """`text` with the password of every URL (a NATS URL's token), every bearer token and
    every tenant key's secret in it replaced by `***`."""
    if "@" in text:
        text = _CREDENTIALS.sub(r"\g<scheme>***@", text)
        text = _TOKEN.sub(r"\g<scheme>***@", text)
    if "bearer" in text.lower():
        text = _BEARER.sub(r"\g<scheme>***", text)
    if "rt_" in text:
        text = _KEY.sub(r"\g<tenant>***", text)
    return text


def hide_secrets(
    _: object, __: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """No URL's password reaches a log line (a NATS or Postgres URL logged on disconnect or in
    an error), whatever field carries it."""
    return {k: _hidden(v) for k, v in event_dict.items()}


def _hidden(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, tuple):
        # a tuple stays one: an `exc_info` tuple made a list is not read as one, and the
        # traceback was lost (asyncio's "Task exception was never retrieved"); its text is
        # redacted once formatted
        return tuple(_hidden(v) for v in value)
    if isinstance(value, list):
        return [_hidden(v) for v in value]
    if isinstance(value, dict):
        return {k: _hidden(v) for k, v in value.items()}
    return value


def _plain_redacted_traceback(out: TextIO, exc_info: structlog.typing.ExcInfo) -> None:
    """The console's traceback: Python's own text, redacted. The console renderer formats an
    exception after `hide_secrets` has run, and rich's (colours within a URL, lines wrapped
    across one) defeated redacting what it wrote; no frame's locals either (keys, request
    bodies and model output)."""
    written = io.StringIO()
    structlog.dev.plain_traceback(written, exc_info)
    out.write(redact(written.getvalue()))


def _identity(
    _: object, __: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event_dict


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; `name` is usually the module's `__name__`."""
    return structlog.stdlib.get_logger(name)
