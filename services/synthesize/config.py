"""Settings of the synthesize service (`RETRACE_*` blocks, plus `RETRACE_SYNTHESIZE_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8103


class SynthesizeConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the synthesize service has no settings of its own yet."""
