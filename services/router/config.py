"""Settings of the router service (`RETRACE_*` blocks, plus `RETRACE_ROUTER_*`)."""

from __future__ import annotations

from shared.config import ServiceConfig

DEFAULT_PORT = 8080


class RouterConfig(ServiceConfig, kw_only=True, frozen=True):
    """The shared blocks; the router service has no settings of its own yet."""
