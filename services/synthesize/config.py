"""Settings of the synthesize service (`RETRACE_*` blocks, plus `RETRACE_SYNTHESIZE_*`)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import ServiceConfig

DEFAULT_PORT = 8103


class SynthesizeConfig(ServiceConfig, kw_only=True, frozen=True):
    calibration_tasks: Annotated[int, msgspec.Meta(ge=1)] = 100
    """Tasks (GRPO groups) per calibration rollout; the paper's 100. Lower it on a CPU."""
    calibration_samples: Annotated[int, msgspec.Meta(ge=2, le=64)] = 16
    """Samples per task; the paper's 16."""
    max_regenerations: Annotated[int, msgspec.Meta(ge=0)] = 5
    """Adjust-and-recalibrate rounds before a capability's environment is reported as failed."""
    temperature: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Sampling temperature of the calibration rollouts (the policy as GRPO will sample it)."""
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    """Agent turns per calibration episode: set it to the train service's `max_turns`, so
    calibration judges the episodes GRPO will sample. None: the rollout service's limit."""
    hint_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.25
    """Share of each calibration group whose rollouts see the task's hint at the first
    calibration (the paper hints 0.25 to 0.5 of each GRPO group); calibration then tunes it
    up to `max_hint_share`."""
    max_hint_share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    determinism_seeds: Annotated[int, msgspec.Meta(ge=1)] = 3
    """Seeds each generated spec is built twice on before it is accepted for calibration."""
    seed: int = 0
    """Sampling seed of calibration rollouts (attempt n samples with seed + n): a calibration's
    verdict is the same each time the same environment is calibrated for the same agent."""
    writer_model: str | None = None
    """A model on the inference endpoint (`RETRACE_MODEL_URL`) that writes each capability's
    scenario template and checks; unset, or when its spec fails every check: the default
    spec of the capability's nearest hand-written family."""
    writer_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    """Replies asked of the writer (each bad one fed back) before falling back."""
