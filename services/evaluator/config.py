"""Settings of the evaluator service (`RETRACE_*` blocks, plus `RETRACE_EVALUATOR_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8105


class EvaluatorConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the evaluator service has no settings of its own yet."""
