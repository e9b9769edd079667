"""Bus contracts: every message retrace sends, in one place, versioned.

Subjects are `<prefix>.<tenant>.<stage>.<event>`; the tenant lives in the subject only, so a
payload can never claim another tenant. Each contract names its stage, event, version and
stream. Contracts only grow: new fields go last with defaults; a breaking change is a new
contract with a new event name (`requested_v2`) and VERSION.
"""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

import msgspec

from shared.errors import ContractError

Split = Literal["train", "test"]
Purpose = Literal["diagnose", "evaluate", "calibrate", "adhoc"]
"""Why a rollout runs; consumers of rollout.completed act on their own purposes only."""


class Contract(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=False):
    """Base of every bus message. Unknown fields are ignored so old readers accept newer writers."""

    STAGE: ClassVar[str]
    EVENT: ClassVar[str]
    VERSION: ClassVar[int] = 1
    STREAM: ClassVar[Literal["events", "work"]] = "events"
    """events: kept for every interested consumer; work: each message taken by one worker."""

    @classmethod
    def kind(cls) -> str:
        return f"{cls.STAGE}.{cls.EVENT}"


class Sampling(msgspec.Struct, kw_only=True, frozen=True):
    """Generation settings for an episode."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None


class RolloutRequested(Contract, frozen=True):
    """CLI / evaluator / synthesize -> rollout: run an agent on an environment's tasks."""

    STAGE = "rollout"
    EVENT = "requested"

    request_id: uuid.UUID
    agent_id: uuid.UUID
    environment: str
    split: Split | None = None
    task_ids: list[str] = msgspec.field(default_factory=list)
    trials: int = 1
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    adapter: str | None = None
    """A LoRA adapter the inference endpoint has loaded, or None for the agent's base model."""
    cycle_id: uuid.UUID | None = None
    purpose: Purpose = "adhoc"


class RolloutCompleted(Contract, frozen=True):
    """rollout -> contrast, evaluator, synthesize: every trajectory of a request is stored."""

    STAGE = "rollout"
    EVENT = "completed"

    request_id: uuid.UUID
    agent_id: uuid.UUID
    trajectories: int
    successes: int
    mean_reward: float
    cycle_id: uuid.UUID | None = None
    purpose: Purpose = "adhoc"


class CapabilitiesIdentified(Contract, frozen=True):
    """contrast -> synthesize: capabilities the agent lacks were stored for a cycle."""

    STAGE = "capabilities"
    EVENT = "identified"

    agent_id: uuid.UUID
    capability_ids: list[uuid.UUID]
    """The capabilities kept by the criterion, best first."""
    cycle_id: uuid.UUID | None = None
    request_id: uuid.UUID | None = None
    """The diagnosis rollout the capabilities were found in."""


class EnvironmentReady(Contract, frozen=True):
    """synthesize -> evaluator: a calibrated training environment for one capability exists."""

    STAGE = "environment"
    EVENT = "ready"

    environment_id: uuid.UUID
    capability_id: uuid.UUID
    cycle_id: uuid.UUID | None = None


class TrainRequested(Contract, frozen=True):
    """evaluator -> train (work queue, one worker per job): train one LoRA adapter."""

    STAGE = "train"
    EVENT = "requested"
    STREAM = "work"

    job_id: uuid.UUID
    environment_id: uuid.UUID
    capability_id: uuid.UUID | None = None
    cycle_id: uuid.UUID | None = None


class AdapterTrained(Contract, frozen=True):
    """train -> evaluator, router: an adapter's weights are stored and registered."""

    STAGE = "adapter"
    EVENT = "trained"

    adapter_id: uuid.UUID
    job_id: uuid.UUID
    cycle_id: uuid.UUID | None = None


class CycleEvaluate(Contract, frozen=True):
    """cycle owner -> evaluator: evaluate a cycle's adapters on the test split."""

    STAGE = "cycle"
    EVENT = "evaluate"

    cycle_id: uuid.UUID


class CycleCompleted(Contract, frozen=True):
    """evaluator -> router, CLI: a cycle ended (promoted, rejected or failed)."""

    STAGE = "cycle"
    EVENT = "completed"

    cycle_id: uuid.UUID
    outcome: Literal["promoted", "rejected", "failed"]
    reason: str = ""


_REGISTRY: dict[str, type[Contract]] = {}


def register(contract: type[Contract]) -> type[Contract]:
    """Make a contract known to the bus (the built-in ones are registered below)."""
    kind = contract.kind()
    existing = _REGISTRY.get(kind)
    if existing is not None and existing is not contract:
        raise ValueError(f"two contracts claim {kind}: {existing.__name__} and {contract.__name__}")
    _REGISTRY[kind] = contract
    return contract


def contracts() -> tuple[type[Contract], ...]:
    return tuple(_REGISTRY.values())


def contract_for(stage: str, event: str) -> type[Contract]:
    try:
        return _REGISTRY[f"{stage}.{event}"]
    except KeyError:
        raise ContractError(f"no contract for {stage}.{event}") from None


def encode(message: Contract) -> bytes:
    return msgspec.json.encode(message)


def decode(data: bytes, contract: type[Contract]) -> Contract:
    """Decode and validate a payload; any mismatch is a ContractError saying where."""
    try:
        return msgspec.json.decode(data, type=contract)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ContractError(f"{contract.kind()} v{contract.VERSION}: {exc}") from exc
    except RecursionError as exc:
        # Deeply nested JSON (even in an ignored field) exhausts the decoder's stack: it is a
        # malformed payload like any other, to be dead-lettered rather than crash the consumer.
        raise ContractError(f"{contract.kind()} v{contract.VERSION}: nested too deeply") from exc


for _c in (
    RolloutRequested,
    RolloutCompleted,
    CapabilitiesIdentified,
    EnvironmentReady,
    TrainRequested,
    AdapterTrained,
    CycleEvaluate,
    CycleCompleted,
):
    register(_c)


class DeadLetter(msgspec.Struct, kw_only=True, frozen=True):
    """runtime -> the dead-letter stream (`<prefix>_dlq.<tenant>.<stage>.<event>`): a message
    that could not be handled, kept with why, for inspection and replay."""

    subject: str
    consumer: str
    error: str
    error_kind: Literal["contract", "permanent", "exhausted"]
    deliveries: int
    msg_id: str
    stream_sequence: int
    payload_b64: str
    """The original bytes, exactly."""
    payload_text: str
    """The original bytes as text (invalid UTF-8 replaced), for humans."""
