"""What the control API reads and writes: msgspec Structs, so the OpenAPI document is built
from the very types the handlers decode and encode. Request bodies refuse unknown fields (a
misspelt setting is an error, not a silent default)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

from shared.messages import CycleSettings
from shared.store import quotas
from shared.store.models import (
    Adapter,
    Agent,
    ApiKey,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    KeyScope,
    Tenant,
    Trajectory,
)
from shared.store.quotas import Quotas, Usage

Name = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=100,
        description="1-100 lowercase letters, digits, '-' and '_' (checked by the handler, "
        "whose 400 says so in words)",
    ),
]
Text = Annotated[str, msgspec.Meta(max_length=100_000, pattern="^[^\x00]*$")]
"""Any text but U+0000, which Postgres cannot store."""
Ref = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern="^[^\x00]*$")]


class AgentCreate(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    name: Name
    model: Ref
    """The base model's name on the inference endpoint."""
    environment: Ref
    """The target environment (`retrace env list`, an `http://` URL or an `mcp:` file)."""
    system_prompt: Text = ""


class AgentUpdate(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Only the fields given change."""

    model: Ref | None = None
    environment: Ref | None = None
    system_prompt: Text | None = None


class AgentOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    model: str
    environment: str
    system_prompt: str
    production_adapters: list[str]
    """Ids of the adapters the router serves (empty: the base model alone)."""
    created_at: datetime

    @classmethod
    def of(cls, row: Agent) -> AgentOut:
        return cls(
            id=row.id,
            name=row.name,
            model=row.model,
            environment=row.environment,
            system_prompt=row.system_prompt,
            production_adapters=[str(a) for a in row.production_adapters or []],
            created_at=row.created_at,
        )


class AgentList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[AgentOut]
    next_cursor: str | None = None
    """Pass as `cursor` for the next page; None on the last."""


class Deleted(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    deleted: bool = True


class EnvironmentOut(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    origin: str
    """`built in`, the package that installs it, or `synthesized` (a capability's)."""
    tasks: int | None = None
    train: int | None = None
    test: int | None = None
    error: str | None = None
    """Why it cannot be loaded now (its counts are then unknown)."""
    version: int | None = None
    capability_id: uuid.UUID | None = None
    status: str | None = None
    calibration: dict[str, Any] | None = None

    @classmethod
    def synthesized(cls, row: Environment) -> EnvironmentOut:
        return cls(
            name=f"{row.name}@{row.version}",
            origin="synthesized",
            version=row.version,
            capability_id=row.capability_id,
            status=row.status,
            calibration=row.calibration or {},
        )


class EnvironmentList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[EnvironmentOut]
    """The environments an agent can name, then the tenant's newest synthesized ones."""
    next_cursor: str | None = None


class CycleStart(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    settings: CycleSettings = msgspec.field(default_factory=CycleSettings)
    cycle_id: uuid.UUID | None = None
    """Chosen by the caller to make the request idempotent (a repeat starts nothing new)."""


class WorkOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    kind: str
    label: str
    done: int
    total: int
    unit: str


class CycleOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    agent_id: uuid.UUID
    state: str
    """`requested` until the evaluator takes it, then its stage; `completed` or `failed`."""
    trigger: str = "manual"
    reason: str = ""
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    """Per-stage state: settings, diagnosis, environments, training, evaluation, verdict."""
    work: list[WorkOut] = msgspec.field(default_factory=list)
    """Jobs running now, with their progress."""

    @classmethod
    def of(cls, row: Cycle, work: list[WorkOut] | None = None) -> CycleOut:
        return cls(
            id=row.id,
            agent_id=row.agent_id,
            state=row.state,
            trigger=row.trigger,
            reason=row.reason,
            error=row.error,
            created_at=row.created_at,
            updated_at=row.updated_at,
            data=row.data or {},
            work=work or [],
        )


class CycleList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[CycleOut]
    next_cursor: str | None = None


class CapabilityOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    agent_id: uuid.UUID
    cycle_id: uuid.UUID | None
    name: str
    definition: str
    status: str
    statistics: dict[str, Any]
    """Coverage, delta and the tests behind them."""
    evidence: dict[str, Any]
    """Example trajectories (their ids) and what was seen in them."""
    created_at: datetime

    @classmethod
    def of(cls, row: Capability) -> CapabilityOut:
        return cls(
            id=row.id,
            agent_id=row.agent_id,
            cycle_id=row.cycle_id,
            name=row.name,
            definition=row.definition,
            status=row.status,
            statistics=row.statistics or {},
            evidence=row.evidence or {},
            created_at=row.created_at,
        )


class CapabilityList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[CapabilityOut]
    next_cursor: str | None = None


class EvaluationOut(msgspec.Struct, kw_only=True, frozen=True):
    """One configuration's evaluation on a cycle's test split."""

    id: uuid.UUID
    agent_id: uuid.UUID
    cycle_id: uuid.UUID | None
    configuration: str
    """`base`, `adapter:<name>`, `routed` or `baseline:<name>`."""
    summary: dict[str, Any]
    """Pass rate with its 95% interval, pass^k, mean reward, episodes."""
    results: list[Any]
    """Per task: its id, trials, successes and mean reward."""
    created_at: datetime

    @classmethod
    def of(cls, row: Evaluation) -> EvaluationOut:
        return cls(
            id=row.id,
            agent_id=row.agent_id,
            cycle_id=row.cycle_id,
            configuration=row.configuration,
            summary=row.summary or {},
            results=row.results or [],
            created_at=row.created_at,
        )


class EvaluationList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[EvaluationOut]
    next_cursor: str | None = None


class AdapterOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    agent_id: uuid.UUID
    capability_id: uuid.UUID | None
    cycle_id: uuid.UUID | None
    name: str
    base_model: str
    status: str
    production: bool
    """Served by the router now."""
    training_curve: list[Any]
    heldout: dict[str, Any]
    created_at: datetime

    @classmethod
    def of(cls, row: Adapter, production: bool) -> AdapterOut:
        return cls(
            id=row.id,
            agent_id=row.agent_id,
            capability_id=row.capability_id,
            cycle_id=row.cycle_id,
            name=row.name,
            base_model=row.base_model,
            status=row.status,
            production=production,
            training_curve=row.training_curve or [],
            heldout=row.heldout or {},
            created_at=row.created_at,
        )


class AdapterList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[AdapterOut]
    next_cursor: str | None = None


class TrajectoryOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    agent_id: uuid.UUID
    cycle_id: uuid.UUID | None
    adapter_id: uuid.UUID | None
    source: str
    model: str
    reward: float | None
    success: bool | None
    tokens: int
    latency_ms: float
    created_at: datetime
    messages: list[Any] | None = None
    """The conversation (on a single trajectory; lists leave it out)."""
    reward_breakdown: dict[str, Any] | None = None

    @classmethod
    def of(cls, row: Trajectory, whole: bool = False) -> TrajectoryOut:
        return cls(
            id=row.id,
            agent_id=row.agent_id,
            cycle_id=row.cycle_id,
            adapter_id=row.adapter_id,
            source=row.source,
            model=row.model,
            reward=row.reward,
            success=row.success,
            tokens=row.tokens,
            latency_ms=row.latency_ms,
            created_at=row.created_at,
            messages=row.messages if whole else None,
            reward_breakdown=row.reward_breakdown if whole else None,
        )


class TrajectoryList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[TrajectoryOut]
    next_cursor: str | None = None


class KeyOut(msgspec.Struct, kw_only=True, frozen=True):
    id: uuid.UUID
    name: str
    prefix: str
    """The key's first characters; for a tenant id of 12 characters or more they are all
    its keys' (`rt_<tenant>...`), so the id names a key to revoke."""
    scope: str
    """What it may do: `all`, `read` or `inference` (`shared.store.tenants.SCOPES`)."""
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiKey) -> KeyOut:
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            scope=row.scope,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
        )


class KeyList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[KeyOut]
    next_cursor: str | None = None


class KeyCreate(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A key asked for (POST /v1/keys; the body may be empty: a key of scope `all`)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None
    """What the key is for (`api`, or `admin` for the operator's, when not given)."""
    scope: KeyScope = "all"
    """`inference` for an application's key: the router only. `read`: the control API's
    reads and the console. `all`: every route, keys included."""


class KeyCreated(msgspec.Struct, kw_only=True, frozen=True):
    key: str
    """Shown this once: only its hash is kept."""
    prefix: str
    scope: str = "all"


class TenantCreate(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    name: Annotated[str, msgspec.Meta(max_length=200)] | None = None


class TenantOut(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    name: str
    quotas: Quotas = msgspec.field(default_factory=Quotas)

    @classmethod
    def of(cls, row: Tenant) -> TenantOut:
        return cls(id=row.id, name=row.name, quotas=quotas.parse(row.quotas))


class QuotaStatus(msgspec.Struct, kw_only=True, frozen=True):
    """A tenant's quotas (null: no limit) and its usage against them."""

    quotas: Quotas
    usage: Usage


class TenantList(msgspec.Struct, kw_only=True, frozen=True):
    data: list[TenantOut]
    next_cursor: str | None = None
