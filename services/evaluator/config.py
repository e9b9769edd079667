"""Settings of the evaluator service (`RETRACE_*` blocks, plus `RETRACE_EVALUATOR_*`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.config import ServiceConfig
from shared.embeddings import EmbedderKind

DEFAULT_PORT = 8105


class EvaluatorConfig(ServiceConfig, kw_only=True, frozen=True):
    min_confidence: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    """Routing threshold when scoring the routed set (the router's own default)."""
    routing_mode: Literal["embedding", "learned"] = "embedding"
    """How the routed set is scored: embedding similarity to the adapters' profiles, or the
    router learned from the cycle's train-task results (needs `route_tasks` > 0 in the
    cycle's settings; embedding otherwise)."""
    routing_embedder: EmbedderKind = "cascade-learned"
    """The text similarity routing is scored with: keep it the router's (`RETRACE_ROUTER_EMBEDDER`),
    so the routed set evaluated is the one production serves."""
    monitor_interval_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    """How often the failure-rate monitor looks at production outcomes; 0 turns it off."""
    monitor_window: Annotated[int, msgspec.Meta(ge=1)] = 50
    """Latest production conversations with feedback it looks at, per agent."""
    monitor_min_samples: Annotated[int, msgspec.Meta(ge=1)] = 20
    monitor_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    """Failure rate at which a cycle starts by itself."""
    monitor_rearm: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.4
    """After firing, the rate must fall below this before the monitor can fire again."""
    monitor_cooldown_s: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    cycle_stall_s: Annotated[float, msgspec.Meta(ge=60)] = 86_400.0
    """An active cycle that has not changed for this long is failed (the default of every
    stage; `services/evaluator/stall.py`)."""
    stage_stall_s: dict[
        Literal["requested", "diagnosing", "synthesizing", "training", "evaluating"],
        Annotated[float, msgspec.Meta(ge=60)],
    ] = msgspec.field(default_factory=dict)
    """Per-stage limits over `cycle_stall_s`, e.g.
    `RETRACE_EVALUATOR_STAGE_STALL_S='{"diagnosing": 7200}'`."""
    requested_stall_s: Annotated[float, msgspec.Meta(ge=60)] = 3600.0
    """A cycle the control API recorded that the evaluator has not taken (its request
    dead-lettered, or the evaluator down this long) is failed after this, so it does not hold
    the agent (and the tenant's quota) for a day; `stage_stall_s["requested"]` overrides it."""
    stall_check_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    """How often the stall watch looks."""
