"""Settings of the contrast service (`RETRACE_*` blocks, plus `RETRACE_CONTRAST_*`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.config import ServiceConfig

DEFAULT_PORT = 8102


class ContrastConfig(ServiceConfig, kw_only=True, frozen=True):
    runs: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10
    """Repeated labelings (bootstrap resamples) per capability."""
    min_runs: Annotated[int, msgspec.Meta(ge=1)] = 8
    """Runs a capability must pass to be kept."""
    min_coverage: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.10
    """Share of failed trajectories lacking the capability, in a passing run."""
    min_delta: Annotated[float, msgspec.Meta(ge=-1, le=1)] = 0.20
    """Lacking-rate among failures minus lacking-rate among successes, in a passing run."""
    seed: int = 0
    """Seed of the bootstrap resamples."""
    judge_model: str | None = None
    """A model on the inference endpoint (`RETRACE_MODEL_URL`) that proposes and labels
    capabilities beside the deterministic catalogue; unset: deterministic only."""
    judge_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 4
    """Judge calls at once."""
    merge_similarity: Literal["auto", "embedding", "tokens"] = "auto"
    """How near-duplicate capabilities are recognised by their texts: sentence embeddings
    (all-MiniLM-L6-v2, the `train` extra), word overlap, or embeddings when installed."""
    merge_text_similarity: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    """Text similarity at which two capabilities are duplicates whatever they cover; unset:
    the similarity's own default (0.8 for embeddings, 0.5 for word overlap)."""
    min_successes: Annotated[int, msgspec.Meta(ge=0)] = 5
    """Below this many successful trajectories in a diagnosis, the reference solutions of the
    failed train tasks (replayed and graded) join the successes, so an agent that almost never
    succeeds can still be contrasted (see `services/contrast/references.py`); 0: never."""
    merge_failure_overlap: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.8
    """Overlap (Jaccard) of covered failures at which two capabilities are duplicates."""
