"""Settings of the rollout service (`RETRACE_*` blocks, plus `RETRACE_ROLLOUT_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8101


class RolloutConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the rollout service has no settings of its own yet."""
