"""Bus contracts: every message retrace sends, in one place, versioned.

Subjects are `<prefix>.<tenant>.<stage>.<event>`; the tenant lives in the subject only, so a
payload can never claim another tenant. Each contract names its stage, event, version and
stream. Contracts only grow: new fields go last with defaults; a breaking change is a new
contract with a new event name (`requested_v2`) and VERSION.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Literal

import msgspec

from shared.errors import UNDECODABLE, ContractError

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
    FAIR: ClassVar[bool] = False
    """Consumed in turn across tenants (one consumer per tenant, round robin), so one
    tenant's backlog cannot starve another tenant's work."""
    TIME_LIMIT_S: ClassVar[float] = 600.0
    """How long one handler of this contract may run before it is cancelled and the message
    handed back with backoff (`RETRACE_CONSUMER_TIME_LIMITS` overrides it per contract)."""

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
    TIME_LIMIT_S = 4 * 3600.0
    """A diagnosis or evaluation batch on a CPU model server takes tens of minutes."""

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
    system_prompt: str | None = None
    """Instead of the agent's own system prompt (evaluating an optimised prompt)."""
    hint_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    """Share of each task's trials whose system turn carries the episode's hint (calibrating a
    synthetic environment for hinted GRPO; see shared/envs/guidance.py)."""
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    """At most this many agent turns per episode, below the rollout service's own limit (a
    calibration samples the policy with the turns GRPO will give it); None: the service's."""


class RolloutCompleted(Contract, frozen=True):
    """rollout -> contrast, evaluator, synthesize: every trajectory of a request is stored."""

    STAGE = "rollout"
    EVENT = "completed"
    TIME_LIMIT_S = 3600.0
    """The contrast service's LLM judge labels every trajectory of a diagnosis."""

    request_id: uuid.UUID
    agent_id: uuid.UUID
    trajectories: int
    successes: int
    mean_reward: float
    cycle_id: uuid.UUID | None = None
    purpose: Purpose = "adhoc"
    env_errors: int = 0
    """Episodes the environment broke (its reset, a step or its scoring raised): stored
    ungraded, counted in `trajectories`, left out of `successes` and `mean_reward`."""


class CapabilitiesIdentified(Contract, frozen=True):
    """contrast, evaluator -> synthesize, evaluator: capabilities the agent lacks were stored
    for a cycle (the evaluator sends one for a capability in reserve, and follows them)."""

    STAGE = "capabilities"
    EVENT = "identified"
    TIME_LIMIT_S = 1800.0
    """The synthesize service's writer model may write a spec per capability."""

    agent_id: uuid.UUID
    capability_ids: list[uuid.UUID]
    """The capabilities kept by the criterion, best first, to synthesize now."""
    cycle_id: uuid.UUID | None = None
    request_id: uuid.UUID | None = None
    """The diagnosis rollout the capabilities were found in."""
    reserve_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    """Kept capabilities beyond the cycle's `max_capabilities`, best first: when one of
    `capability_ids` gets no calibrated environment, the evaluator sends the next of these
    to synthesis in its place (in a `capabilities.identified` of its own)."""


class EnvironmentReady(Contract, frozen=True):
    """synthesize -> evaluator: a calibrated training environment for one capability exists."""

    STAGE = "environment"
    EVENT = "ready"

    environment_id: uuid.UUID
    capability_id: uuid.UUID
    cycle_id: uuid.UUID | None = None


class SynthesisFailed(Contract, frozen=True):
    """synthesize -> evaluator: no training environment could be built for a capability."""

    STAGE = "environment"
    EVENT = "failed"

    capability_id: uuid.UUID
    reason: str
    cycle_id: uuid.UUID | None = None


class TrainRequested(Contract, frozen=True):
    """evaluator -> train (work queue, one worker per job): train one LoRA adapter."""

    STAGE = "train"
    EVENT = "requested"
    STREAM = "work"
    FAIR = True
    TIME_LIMIT_S = 12 * 3600.0
    """A CPU job of hundreds of rollouts takes hours; one cut short resumes from its last
    checkpoint."""

    job_id: uuid.UUID
    environment_id: uuid.UUID
    capability_id: uuid.UUID | None = None
    cycle_id: uuid.UUID | None = None


class TrainingFailed(Contract, frozen=True):
    """train -> evaluator: a job will not produce an adapter (bad job or model), and why."""

    STAGE = "train"
    EVENT = "failed"

    job_id: uuid.UUID
    reason: str
    cycle_id: uuid.UUID | None = None


class PromptOptimized(Contract, frozen=True):
    """train -> evaluator: a prompt-optimisation job (the GEPA baseline) finished; the prompt
    is in the job's `config["result"]`."""

    STAGE = "prompt"
    EVENT = "optimized"

    job_id: uuid.UUID
    cycle_id: uuid.UUID | None = None


class AdapterTrained(Contract, frozen=True):
    """train -> evaluator: an adapter's weights are stored and registered."""

    STAGE = "adapter"
    EVENT = "trained"

    adapter_id: uuid.UUID
    job_id: uuid.UUID
    cycle_id: uuid.UUID | None = None


class CycleSettings(msgspec.Struct, kw_only=True, frozen=True):
    """How much a cycle spends at each stage (CPU-friendly defaults; raise them on a GPU)."""

    diagnose_tasks: Annotated[int, msgspec.Meta(ge=1)] | None = 24
    """Train tasks in the diagnosis rollout (None: all)."""
    diagnose_trials: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    eval_tasks: Annotated[int, msgspec.Meta(ge=1)] | None = 24
    """Test tasks in each evaluation rollout (None: all)."""
    eval_trials: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    temperature: Annotated[float, msgspec.Meta(ge=0, le=4)] = 1.0
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256
    seed: int = 1234
    """Sampling seed of the diagnosis and evaluation rollouts: the diagnosis is the same
    each time for the same agent and settings, and in evaluation every configuration sees
    the same seeds, so their outcomes pair up task by task and trial by trial."""
    rollout_budget: Annotated[int, msgspec.Meta(ge=2)] | None = None
    """Rollouts per adapter; None: the train service's."""
    alpha: Annotated[float, msgspec.Meta(gt=0, lt=1)] = 0.05
    """Significance a promotion needs (McNemar and paired bootstrap)."""
    max_capabilities: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Capabilities synthesized and trained, the diagnosis's best first (None: every kept one)."""
    spare_capabilities: Annotated[int, msgspec.Meta(ge=0)] = 1
    """Kept capabilities beyond `max_capabilities` synthesized beside them from the start,
    so that one takes a failed capability's place without a calibration of its own to wait
    for (0: the next in reserve is synthesized only after a failure)."""
    eval_adapters: Literal["routed", "all"] = "routed"
    """Where each adapter is played on the test split: `routed`, only on the tasks routing
    sends it (all the routed set's verdict needs; the base model's rollout runs first, since
    routing reads each task's opening request); `all`, on every test task, which also
    measures each adapter alone and the oracle routing ceiling, at one more rollout of the
    test split per adapter."""
    route_tasks: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Train tasks the base model and each new adapter also run on (one trial each), to
    learn a router from which configuration won which task (0: no learned router)."""
    baselines: list[Literal["grpo_target", "gepa"]] = msgspec.field(
        default_factory=lambda: ["grpo_target", "gepa"]
    )
    """Baselines evaluated beside the routed set, each spending the rollouts of all the
    cycle's adapters: `grpo_target` (one adapter trained with GRPO on the target itself) and
    `gepa` (the system prompt optimised by reflective prompt evolution)."""


class CycleRequested(Contract, frozen=True):
    """CLI / failure-rate monitor -> evaluator: run a TRACE cycle for an agent."""

    STAGE = "cycle"
    EVENT = "requested"

    cycle_id: uuid.UUID
    """Chosen by the requester, so it can follow the cycle; a repeat is a no-op."""
    agent_id: uuid.UUID
    trigger: Literal["manual", "monitor", "demo"] = "manual"
    reason: str = ""
    settings: CycleSettings = msgspec.field(default_factory=CycleSettings)


class CycleCompleted(Contract, frozen=True):
    """evaluator -> subscribers outside retrace: a cycle ended (promoted, rejected or failed).
    No service consumes it; the CLI follows a cycle through its row."""

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
    except RecursionError as exc:
        # Deeply nested JSON (even in an ignored field) exhausts the decoder's stack: it is a
        # malformed payload like any other, to be dead-lettered rather than crash the consumer.
        raise ContractError(f"{contract.kind()} v{contract.VERSION}: nested too deeply") from exc
    except UNDECODABLE as exc:
        raise ContractError(f"{contract.kind()} v{contract.VERSION}: {exc}") from exc


for _c in (
    RolloutRequested,
    RolloutCompleted,
    CapabilitiesIdentified,
    EnvironmentReady,
    SynthesisFailed,
    TrainRequested,
    TrainingFailed,
    PromptOptimized,
    AdapterTrained,
    CycleRequested,
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
