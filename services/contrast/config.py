"""Settings of the contrast service (`RETRACE_*` blocks, plus `RETRACE_CONTRAST_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8102


class ContrastConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the contrast service has no settings of its own yet."""
