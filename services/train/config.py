"""Settings of the train service (`RETRACE_*` blocks, plus `RETRACE_TRAIN_*`).

GRPO defaults are the paper's (LoRA r=16, alpha=16, lr 1e-5, group size 16, no KL); the
rollout budget and episode lengths are what a CPU can afford, raise them on a GPU."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.config import ServiceConfig

DEFAULT_PORT = 8104


class TrainConfig(ServiceConfig, kw_only=True, frozen=True):
    rank: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    alpha: Annotated[int, msgspec.Meta(ge=1, le=512)] = 16
    learning_rate: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1e-5
    group_size: Annotated[int, msgspec.Meta(ge=2, le=256)] = 16
    groups_per_step: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    rollout_budget: Annotated[int, msgspec.Meta(ge=2)] = 256
    """Episodes one adapter may spend (the equal-budget comparisons count these)."""
    max_steps: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1, le=8192)] = 192
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=64)] = 6
    temperature: Annotated[float, msgspec.Meta(gt=0, le=4)] = 1.0
    seed: int = 0
    sample_ahead: Annotated[int, msgspec.Meta(ge=0, le=16)] = 0
    """Later GRPO steps sampled together with each step, from the same weights (one batch;
    those steps train on rollouts that many updates old); 0: every step samples from its
    own weights."""
    hint_share: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    """Share of each group sampled with the task's hint; unset: the share the synthetic
    environment's calibration accepted (0 for targets, which have no hints)."""
    hint_correction: Literal["none", "tis"] = "none"
    """`none`: hinted rollouts trained as if unhinted (the paper); `tis`: truncated importance
    weights unhinted / hinted on their tokens."""
    format_bonus: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    """Reward added for the share of a rollout's tool-calling turns written in the canonical
    tagged form (what vLLM's tool parser reads); 0: the environment's reward alone."""
    heldout_tasks: Annotated[int, msgspec.Meta(ge=0)] = 8
    """Test tasks of the environment each new adapter and the base model play, unhinted, to
    measure the adapter's gain with a 95% interval (0: skip the check)."""
    heldout_samples: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    """Seeds per held-out task."""
    heldout_batch: Annotated[int, msgspec.Meta(ge=1, le=256)] = 24
    """Held-out episodes run in lockstep, one model at a time (24 against 8 cut the check's
    wall time by 24% on 2 CPU cores: `benchmarks/heldout_cpu.py`, docs/benchmarks.md)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the policy trains; auto: the GPU when torch sees one."""
    generation: Literal["local", "endpoint"] = "local"
    """Who samples the rollouts: the policy in this process (transformers), or the inference
    endpoint (`RETRACE_MODEL_URL`: vLLM on a GPU) sent the adapter after every step; the
    endpoint must read the artifact store at the same path."""
    threads: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Torch CPU threads; unset: torch's default."""
    reflection_model: str | None = None
    """The model that reflects in prompt optimisation (the GEPA baseline); unset: the
    agent's own model."""
    load_into_endpoint: bool = True
    """Load each trained adapter into the inference endpoint (`/v1/load_lora_adapter`)."""
    max_jobs: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Jobs one worker trains at once (unset: the consumer's concurrency). Each job holds
    its own copy of the model with its activations: on a CPU box three Qwen jobs at once
    reached 13 GB and were killed for memory."""
    cancel_poll_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    """How often a running job looks whether it was cancelled (`retrace cancel`); it then
    stops at its next step (GRPO: the last step stays checkpointed) or episode (GEPA)."""
    lease_s: Annotated[float, msgspec.Meta(ge=5)] = 120.0
    """A running job's claim lasts this long without a renewal (renewed every third of it);
    another delivery of the job while the claim lives is dropped as a duplicate."""
