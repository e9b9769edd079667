"""Typed settings: blocks shared by every service, read once from `RETRACE_*` variables.

A block field maps to `RETRACE_<BLOCK>_<FIELD>` (`nats.url` -> `RETRACE_NATS_URL`); a
service's own top-level field maps to `RETRACE_<SERVICE>_<FIELD>`. Lists take JSON
(`[1, 5]`) or commas (`1,5`); an empty value means "unset" for optional fields.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import msgspec

from shared.errors import ConfigError
from shared.runtime.deadlines import BODY_TIMEOUT_S, IDLE_TIMEOUT_S
from shared.subjects import TOKEN_RE

ENV_PREFIX = "RETRACE_"

# Bounds that turn a nonsensical value into an error naming its variable at start, rather than
# a hang or a crash deep inside NATS or Postgres later. Floats must also be finite (`_parse`).
Count = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
"""A timeout or window: zero would mean "no time at all"."""
Pause = Annotated[float, msgspec.Meta(ge=0)]
"""A wait that may be zero."""
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
SubjectToken = Annotated[str, msgspec.Meta(pattern=TOKEN_RE.pattern)]


class NatsConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How to reach NATS JetStream and how retrace names things on it."""

    url: str | None = None
    """nats:// URL; unset starts (or reuses) an embedded nats-server under the data dir."""
    subject_prefix: SubjectToken = "retrace"
    """First token of every subject: `<prefix>.<tenant>.<stage>.<event>`."""
    stream_prefix: str = "RETRACE"
    """Prefix of every stream name, so several deployments (or tests) share one server."""
    connect_timeout: Seconds = 5.0
    """Seconds for one connection attempt."""
    request_timeout: Seconds = 10.0
    """Seconds for a publish ack or a JetStream API call."""
    reconnect_attempts: NonNegative = 60
    """Reconnection attempts after a lost connection before the service gives up and exits."""
    reconnect_wait: Pause = 2.0
    """Seconds between reconnection attempts."""
    duplicate_window: Seconds = 120.0
    """Seconds JetStream remembers a `Nats-Msg-Id` to drop duplicate publishes."""
    max_age_days: Seconds = 7.0
    """How long event streams keep messages."""


class ConsumerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How a service pulls and acknowledges work."""

    concurrency: Count = 4
    """Messages handled at once by one service instance."""
    ack_wait: Seconds = 30.0
    """Seconds before an unacknowledged message is redelivered; long handlers heartbeat."""
    max_deliver: Count = 5
    """Deliveries before a failing message goes to the dead-letter stream."""
    backoff: list[Pause] = msgspec.field(default_factory=lambda: [1.0, 5.0, 15.0, 60.0])
    """Delay in seconds before redelivery after the n-th failure (the last value repeats)."""
    shutdown_grace: Pause = 30.0
    """Seconds in-flight handlers get to finish on SIGTERM before they are cancelled and nak'd."""
    fetch_timeout: Seconds = 1.0
    """Seconds one pull waits for messages."""
    time_limits: dict[str, Seconds] = msgspec.field(default_factory=dict)
    """Seconds one handler may run, by contract kind (`{"train.requested": 86400}`), over the
    contract's own `TIME_LIMIT_S`; past it the handler is cancelled and the message handed
    back with backoff (a delivery attempt spent)."""

    def time_limit(self, kind: str, default: float) -> float:
        return self.time_limits.get(kind, default)


class DatabaseConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How to reach Postgres."""

    url: str | None = None
    """SQLAlchemy URL (`postgresql+asyncpg://...`); unset starts an embedded Postgres."""
    schema: str = "public"
    """Schema holding retrace's tables (tests use one per run)."""
    pool_size: Count = 5
    """Connections kept open per process."""
    connect_timeout: Seconds = 10.0
    """Seconds to open one connection."""
    statement_timeout_ms: Count = 30_000
    """Server-side limit for one statement (Postgres would read 0 as "no limit")."""


class ModelConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The OpenAI-compatible inference endpoint (`retrace serve-model`, vLLM, or hosted)."""

    url: str = "http://127.0.0.1:8000/v1"
    api_key: str = "EMPTY"
    """Sent as a bearer token; local servers ignore it."""
    admin_key: str | None = None
    """Sent instead of `api_key` to load and unload adapters, where the endpoint has an
    admin key of its own (`retrace serve-model --admin-key`)."""
    request_timeout: Seconds = 300.0
    """Seconds for one completion (generation on a busy CPU server is slow)."""


class HttpConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Where a service serves `/healthz`, `/metrics` and its own endpoints."""

    host: str = "127.0.0.1"
    port: Port = 0
    """0 picks the service's default port."""
    metrics_key: str | None = None
    """Bearer token `/metrics` requires (`RETRACE_HTTP_METRICS_KEY`); unset: open. Set it
    where the port is public (the router's): its metrics name every tenant's adapters."""
    idle_timeout_s: Seconds = IDLE_TIMEOUT_S
    """A connection without a whole request for this long (idle, or its headers still
    arriving) is closed (`RETRACE_HTTP_IDLE_TIMEOUT_S`)."""
    body_timeout_s: Seconds = BODY_TIMEOUT_S
    """A request body must arrive within this (408 after; `RETRACE_HTTP_BODY_TIMEOUT_S`)."""
    reuse_port: bool = False
    """Let several processes of one service listen on the same port, the kernel sharing
    the connections (`RETRACE_HTTP_REUSE_PORT`: the router on more cores). Each process
    answers `/healthz` and `/metrics` for itself."""


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


class EnvironmentsConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Where the services may reach an HTTP environment (`shared/envs/remote/address.py`)."""

    private_allowed: bool = True
    """Whether at a private or loopback address (`RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED`). A
    deployment whose environment servers are all public sets it false: every connection is
    then checked, so a tenant's name that resolved to a public address when the control API
    checked it and to an inner one later (DNS rebinding) reaches nothing. Link-local and
    metadata addresses are refused either way."""
    private_hosts: list[str] = msgspec.field(default_factory=list)
    """Names besides those of one label or under `.internal`, `.local`, `.localhost`,
    `.home.arpa` and `.test` that may lead to a private or loopback address
    (`RETRACE_ENVIRONMENTS_PRIVATE_HOSTS`, comma-separated; `*.corp.example` for every name
    under one): an inner server behind a name public DNS could answer for. Any other name
    that answers such an address when a service connects is refused (DNS rebinding)."""

    def apply(self) -> None:
        """This process's connections to environments follow these settings."""
        from shared.envs.remote.address import allow_private

        allow_private(self.private_allowed, self.private_hosts)


class ServiceConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The blocks every service reads; a service's config subclasses this and adds fields."""

    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    database: DatabaseConfig = msgspec.field(default_factory=DatabaseConfig)
    consumer: ConsumerConfig = msgspec.field(default_factory=ConsumerConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    environments: EnvironmentsConfig = msgspec.field(default_factory=EnvironmentsConfig)


C = TypeVar("C", bound=msgspec.Struct)
_INVALID = object()
"""What `_parse` returns for a value it rejected (and recorded): the field is left out."""


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
            reported = len(errors)
            for sub in msgspec.structs.fields(field.type):
                key = f"{ENV_PREFIX}{field.name}_{sub.name}".upper()
                _read(env, key, sub, block, errors)
            if len(errors) == reported:  # else the block's own variables are already named
                values[field.name] = _build(field.type, block, field.name, errors)
        else:
            key = f"{ENV_PREFIX}{service or cls.__name__}_{field.name}".upper()
            _read(env, key, field, values, errors)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    try:
        return msgspec.convert(values, cls)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc


def _read(
    env: Mapping[str, str],
    key: str,
    field: msgspec.structs.FieldInfo,
    into: dict[str, Any],
    errors: list[str],
) -> None:
    """Put `field`'s value from `key` into `into`, or record why not; unset keeps the default."""
    if key not in env:
        if field.required:
            errors.append(f"{key}: required, not set")
        return
    value = _parse(key, env[key], field.type, errors)
    if value is not _INVALID:
        into[field.name] = value


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _build(tp: type[msgspec.Struct], block: dict[str, Any], name: str, errors: list[str]) -> Any:
    try:
        return msgspec.convert(block, tp)
    except msgspec.ValidationError as exc:
        errors.append(f"{ENV_PREFIX}{name.upper()}_*: {exc}")
        return None


def _parse(key: str, raw: str, tp: Any, errors: list[str]) -> Any:
    """Turn one variable's text into `tp`, or record an error naming `key`."""
    text = raw.strip()
    args = get_args(tp)
    if text == "" and type(None) in args:
        return None
    value: Any = text
    if get_origin(tp) is dict:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            errors.append(f"{key}={raw!r}: not a JSON object ({exc.msg})")
            return _INVALID
    elif get_origin(tp) is list or any(get_origin(a) is list for a in args):
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                errors.append(f"{key}={raw!r}: not a JSON list ({exc.msg})")
                return _INVALID
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    try:
        parsed = msgspec.convert(value, tp, strict=False)
    except msgspec.ValidationError as exc:
        errors.append(f"{key}={raw!r}: {exc}")
        return _INVALID
    # Lax conversion reads "inf" and "nan" as floats; no setting here means either.
    numbers = (
        list(parsed.values())
        if isinstance(parsed, dict)
        else parsed
        if isinstance(parsed, list)
        else [parsed]
    )
    if any(isinstance(n, float) and not math.isfinite(n) for n in numbers):
        errors.append(f"{key}={raw!r}: expected a finite number")
        return _INVALID
    return parsed
