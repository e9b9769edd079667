"""Typed settings: blocks shared by every service, read once from `RETRACE_*` variables.

A block field maps to `RETRACE_<BLOCK>_<FIELD>` (`nats.url` -> `RETRACE_NATS_URL`); a
service's own top-level field maps to `RETRACE_<SERVICE>_<FIELD>`. Lists take JSON
(`[1, 5]`) or commas (`1,5`); an empty value means "unset" for optional fields.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import msgspec

from shared.errors import ConfigError

ENV_PREFIX = "RETRACE_"


class NatsConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How to reach NATS JetStream and how retrace names things on it."""

    url: str | None = None
    """nats:// URL; unset starts (or reuses) an embedded nats-server under the data dir."""
    subject_prefix: str = "retrace"
    """First token of every subject: `<prefix>.<tenant>.<stage>.<event>`."""
    stream_prefix: str = "RETRACE"
    """Prefix of every stream name, so several deployments (or tests) share one server."""
    connect_timeout: float = 5.0
    """Seconds for one connection attempt."""
    request_timeout: float = 10.0
    """Seconds for a publish ack or a JetStream API call."""
    reconnect_attempts: int = 60
    """Reconnection attempts after a lost connection before the service gives up and exits."""
    reconnect_wait: float = 2.0
    """Seconds between reconnection attempts."""
    duplicate_window: float = 120.0
    """Seconds JetStream remembers a `Nats-Msg-Id` to drop duplicate publishes."""
    max_age_days: float = 7.0
    """How long event streams keep messages."""


class ConsumerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How a service pulls and acknowledges work."""

    concurrency: int = 4
    """Messages handled at once by one service instance."""
    ack_wait: float = 30.0
    """Seconds before an unacknowledged message is redelivered; long handlers heartbeat."""
    max_deliver: int = 5
    """Deliveries before a failing message goes to the dead-letter stream."""
    backoff: list[float] = msgspec.field(default_factory=lambda: [1.0, 5.0, 15.0, 60.0])
    """Delay in seconds before redelivery after the n-th failure (the last value repeats)."""
    shutdown_grace: float = 30.0
    """Seconds in-flight handlers get to finish on SIGTERM before they are cancelled and nak'd."""
    fetch_timeout: float = 1.0
    """Seconds one pull waits for messages."""


class DatabaseConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How to reach Postgres."""

    url: str | None = None
    """SQLAlchemy URL (`postgresql+asyncpg://...`); unset starts an embedded Postgres."""
    schema: str = "public"
    """Schema holding retrace's tables (tests use one per run)."""
    pool_size: int = 5
    """Connections kept open per process."""
    connect_timeout: float = 10.0
    """Seconds to open one connection."""
    statement_timeout_ms: int = 30_000
    """Server-side limit for one statement."""


class HttpConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Where a service serves `/healthz`, `/metrics` and its own endpoints."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks the service's default port."""


class LogConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Logging output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    """auto: console in a terminal, JSON lines otherwise."""


class StorageConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Local directories."""

    data_dir: str = ".retrace"
    """Embedded servers' data and run state."""
    artifact_dir: str | None = None
    """Adapter weights and other large files; default `<data_dir>/artifacts`."""

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def artifact_path(self) -> Path:
        return (
            Path(self.artifact_dir).expanduser().resolve()
            if self.artifact_dir
            else self.data_path / "artifacts"
        )


class ServiceConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The blocks every service reads; a service's config subclasses this and adds fields."""

    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    database: DatabaseConfig = msgspec.field(default_factory=DatabaseConfig)
    consumer: ConsumerConfig = msgspec.field(default_factory=ConsumerConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)


C = TypeVar("C", bound=msgspec.Struct)


def load_config(
    cls: type[C], *, service: str | None = None, env: Mapping[str, str] | None = None
) -> C:
    """Build `cls` from the environment; every bad value is reported with its variable name."""
    env = os.environ if env is None else env
    errors: list[str] = []
    values: dict[str, Any] = {}
    for field in msgspec.structs.fields(cls):
        if _is_struct(field.type):
            block: dict[str, Any] = {}
            for sub in msgspec.structs.fields(field.type):
                key = f"{ENV_PREFIX}{field.name}_{sub.name}".upper()
                if key in env:
                    block[sub.name] = _parse(key, env[key], sub.type, errors)
            values[field.name] = _build(field.type, block, field.name, errors)
        else:
            key = f"{ENV_PREFIX}{service or cls.__name__}_{field.name}".upper()
            if key in env:
                values[field.name] = _parse(key, env[key], field.type, errors)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    try:
        return msgspec.convert(values, cls)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _build(tp: type[msgspec.Struct], block: dict[str, Any], name: str, errors: list[str]) -> Any:
    try:
        return msgspec.convert(block, tp)
    except msgspec.ValidationError as exc:
        errors.append(f"{ENV_PREFIX}{name.upper()}_*: {exc}")
        return tp()


def _parse(key: str, raw: str, tp: Any, errors: list[str]) -> Any:
    """Turn one variable's text into `tp`, or record an error naming `key`."""
    text = raw.strip()
    args = get_args(tp)
    if text == "" and type(None) in args:
        return None
    value: Any = text
    if get_origin(tp) is list or any(get_origin(a) is list for a in args):
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                errors.append(f"{key}={raw!r}: not a JSON list ({exc.msg})")
                return None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return msgspec.convert(value, tp, strict=False)
    except msgspec.ValidationError as exc:
        errors.append(f"{key}={raw!r}: {exc}")
        return None
