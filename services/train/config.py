"""Settings of the train service (`RETRACE_*` blocks, plus `RETRACE_TRAIN_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8104


class TrainConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the train service has no settings of its own yet."""
