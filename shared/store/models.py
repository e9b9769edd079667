"""Postgres tables (SQLAlchemy 2 declarative). Every row carries its tenant's id."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, get_args

import msgspec
from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, synonym
from sqlalchemy.types import TypeDecorator

from shared.messages import CycleSettings

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def without_nul(value: Any) -> Any:
    """`value` with every U+0000 in its strings and keys replaced by U+FFFD: Postgres cannot
    store U+0000 in JSONB (or text), and a message that carries one (from a user, or from a
    model) must not lose the turn it belongs to."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


def storable_json(value: Any) -> str:
    """`value` as JSON text Postgres stores (`without_nul`), walked only when its encoding
    shows an escaped U+0000: walking every turn's whole history was a share of the
    router's event loop on long agent conversations."""
    encoded = msgspec.json.encode(value)
    if b"\\u0000" in encoded:
        encoded = msgspec.json.encode(without_nul(value))
    return encoded.decode()


class StorableJSONB(TypeDecorator[Any]):
    """JSONB that stores any JSON value, U+0000 included (see `without_nul`)."""

    impl = JSONB
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return without_nul(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {
        dict[str, Any]: StorableJSONB,
        list[Any]: StorableJSONB,
        uuid.UUID: UUID(as_uuid=True),
    }


def _id() -> Mapped[uuid.UUID]:
    return mapped_column(primary_key=True, default=uuid.uuid4)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class TenantOwned:
    """Mixin: the row belongs to one tenant; sessions filter and check it (see scope.py)."""

    tenant_id: Mapped[str] = mapped_column(
        String(63), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    quotas: Mapped[dict[str, Any]] = mapped_column(
        JSONB, default=dict, server_default=text("'{}'::jsonb")
    )
    """Its limits (shared/store/quotas.py); `{}`: none."""

    # Lets tenant scoping treat the root table like every other one.
    tenant_id: Mapped[str] = synonym("id")


KeyScope = Literal["all", "read", "inference"]
"""What an API key may do (`shared.store.tenants.SCOPES` says what each allows)."""


class ApiKey(TenantOwned, Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint(f"scope IN ({', '.join(map(repr, get_args(KeyScope)))})", name="scope"),
    )

    id: Mapped[uuid.UUID] = _id()
    name: Mapped[str] = mapped_column(Text)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    """First characters of the key, shown to humans and used to look the key up."""
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of the whole key; the key itself is never stored."""
    scope: Mapped[str] = mapped_column(String(16), server_default="all")
    """What the key may do (`shared.store.tenants.SCOPES`): `all`, `read` or `inference`."""
    created_at: Mapped[datetime] = _created()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Agent(TenantOwned, Base):
    __tablename__ = "agents"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[uuid.UUID] = _id()
    name: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(Text)
    environment: Mapped[str] = mapped_column(Text)
    """Target environment reference, e.g. `toolbox` or `tau2:retail`."""
    system_prompt: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    production_adapters: Mapped[list[Any]] = mapped_column(default=list)
    """Adapter ids of the promoted configuration the router serves."""
    created_at: Mapped[datetime] = _created()


class Environment(TenantOwned, Base):
    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("tenant_id", "name", "version"),)

    id: Mapped[uuid.UUID] = _id()
    name: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, default=1)
    kind: Mapped[str] = mapped_column(String(16))
    """target | synthetic"""
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    capability_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("capabilities.id", ondelete="SET NULL")
    )
    calibration: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _created()


class Task(TenantOwned, Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("tenant_id", "environment_id", "external_id"),
        Index(None, "tenant_id", "environment_id", "split"),
    )

    id: Mapped[uuid.UUID] = _id()
    environment_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("environments.id", ondelete="CASCADE")
    )
    external_id: Mapped[str] = mapped_column(Text)
    split: Mapped[str] = mapped_column(String(8))
    """train | test, fixed once when the task is stored."""
    kind: Mapped[str] = mapped_column(Text, default="")
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Cycle(TenantOwned, Base):
    __tablename__ = "cycles"
    __table_args__ = (
        # One active cycle per agent.
        Index(
            "uq_cycles_active_agent",
            "tenant_id",
            "agent_id",
            unique=True,
            postgresql_where=text("state NOT IN ('completed', 'failed')"),
        ),
    )

    id: Mapped[uuid.UUID] = _id()
    agent_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), index=True
    )
    state: Mapped[str] = mapped_column(String(32), default="pending")
    trigger: Mapped[str] = mapped_column(String(32), default="manual")
    reason: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    @property
    def settings(self) -> CycleSettings:
        """The settings the cycle was requested with (`data["settings"]`)."""
        return msgspec.convert(self.data.get("settings", {}), CycleSettings)


class Trajectory(TenantOwned, Base):
    __tablename__ = "trajectories"
    __table_args__ = (
        # Idempotent inserts: one row per (request, task, trial).
        UniqueConstraint("tenant_id", "request_id", "task_id", "trial"),
        Index(None, "tenant_id", "agent_id", "created_at"),
        Index(None, "tenant_id", "cycle_id"),
    )

    id: Mapped[uuid.UUID] = _id()
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    request_id: Mapped[uuid.UUID | None] = mapped_column()
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="SET NULL"))
    task_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    environment_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("environments.id", ondelete="SET NULL")
    )
    adapter_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("adapters.id", ondelete="SET NULL")
    )
    trial: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(16), default="rollout")
    """rollout | production | calibration"""
    model: Mapped[str] = mapped_column(Text, default="")
    messages: Mapped[list[Any]] = mapped_column(default=list)
    reward: Mapped[float | None] = mapped_column(Float)
    reward_breakdown: Mapped[dict[str, Any]] = mapped_column(default=dict)
    success: Mapped[bool | None] = mapped_column(Boolean)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = _created()


class Capability(TenantOwned, Base):
    __tablename__ = "capabilities"
    __table_args__ = (UniqueConstraint("tenant_id", "cycle_id", "name"),)

    id: Mapped[uuid.UUID] = _id()
    agent_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), index=True
    )
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="SET NULL"))
    name: Mapped[str] = mapped_column(String(100))
    definition: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    statistics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="identified")
    created_at: Mapped[datetime] = _created()


class Adapter(TenantOwned, Base):
    __tablename__ = "adapters"

    id: Mapped[uuid.UUID] = _id()
    agent_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), index=True
    )
    capability_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("capabilities.id", ondelete="SET NULL")
    )
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="SET NULL"))
    name: Mapped[str] = mapped_column(Text)
    artifact_uri: Mapped[str] = mapped_column(Text, default="")
    base_model: Mapped[str] = mapped_column(Text)
    lora_config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    training_curve: Mapped[list[Any]] = mapped_column(default=list)
    status: Mapped[str] = mapped_column(String(16), default="training")
    heldout: Mapped[dict[str, Any]] = mapped_column(
        default=dict, server_default=text("'{}'::jsonb")
    )
    """The adapter against the base model on its environment's held-out test tasks, unhinted:
    means, the gain with its 95% interval (services/train/heldout.py)."""
    created_at: Mapped[datetime] = _created()


class TrainingJob(TenantOwned, Base):
    __tablename__ = "training_jobs"
    __table_args__ = (Index(None, "tenant_id", "status"),)

    id: Mapped[uuid.UUID] = _id()
    environment_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("environments.id", ondelete="CASCADE")
    )
    capability_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("capabilities.id", ondelete="SET NULL")
    )
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="SET NULL"))
    adapter_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("adapters.id", ondelete="SET NULL")
    )
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(Text)
    checkpoint_uri: Mapped[str | None] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class Evaluation(TenantOwned, Base):
    __tablename__ = "evaluations"
    __table_args__ = (Index(None, "tenant_id", "cycle_id"),)

    id: Mapped[uuid.UUID] = _id()
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="CASCADE"))
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    configuration: Mapped[str] = mapped_column(Text)
    """base | adapter:<name> | routed | baseline:<name>"""
    results: Mapped[list[Any]] = mapped_column(default=list)
    """Per task: task id, trials, successes, mean reward."""
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Pass rate with its 95% interval, pass^k, mean reward, rollouts used."""
    created_at: Mapped[datetime] = _created()


class Conversation(TenantOwned, Base):
    """A production conversation through the router: the adapter it was routed to (once, on
    its first turn), its trajectory, and the hash of its messages so far (`tip`), by which
    the next request of the same conversation is recognised (its history starts with them)."""

    __tablename__ = "conversations"
    __table_args__ = (
        Index(None, "tenant_id", "agent_id", "tip"),
        Index(None, "tenant_id", "branch_of"),
    )

    id: Mapped[uuid.UUID] = _id()
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    trajectory_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("trajectories.id", ondelete="SET NULL")
    )
    adapter_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("adapters.id", ondelete="SET NULL")
    )
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL")
    )
    """The key the conversation was opened with: its history hash is looked up only there."""
    branch_of: Mapped[uuid.UUID | None]
    """The conversation this one branched from (a turn sent on a history it had moved on
    from: two turns at once, an earlier turn edited), as `route.branch_of` says too; not a
    foreign key (a branch may be written before the conversation another router process
    answered)."""
    tip: Mapped[str] = mapped_column(String(64))
    route: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """How it was routed: mode, chosen adapter, confidence, every candidate's score."""
    turns: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class ProcessedMessage(TenantOwned, Base):
    """A handled bus message and what its handler published, for exactly-once effects."""

    __tablename__ = "processed_messages"

    consumer: Mapped[str] = mapped_column(String(100), primary_key=True)
    msg_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    subject: Mapped[str] = mapped_column(Text)
    outbox: Mapped[list[Any]] = mapped_column(default=list)
    """Messages the handler emitted: published after commit, re-published on redelivery."""
    processed_at: Mapped[datetime] = _created()


class Work(TenantOwned, Base):
    """One long job's progress and its cancellation: a rollout batch (diagnosis, calibration,
    evaluation), a training job or a prompt optimisation (`shared/progress.py`)."""

    __tablename__ = "work"
    __table_args__ = (Index(None, "tenant_id", "cycle_id"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    """The rollout request's or the training job's id."""
    kind: Mapped[str] = mapped_column(String(32))
    """rollout | training | prompt"""
    label: Mapped[str] = mapped_column(Text, default="")
    """What it is for, for a person (a rollout's purpose and environment, a job's capability)."""
    cycle_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("cycles.id", ondelete="CASCADE"))
    done: Mapped[int] = mapped_column(Integer, default=0)
    total: Mapped[int] = mapped_column(Integer, default=0)
    unit: Mapped[str] = mapped_column(String(16), default="episodes")
    state: Mapped[str] = mapped_column(String(16), default="running")
    """running | finished | stopped (handed back, to be resumed) | cancelled"""
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    started_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )
