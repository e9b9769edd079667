"""Settings of the control API service (`RETRACE_*` blocks, plus `RETRACE_API_*`)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import ServiceConfig

DEFAULT_PORT = 8090


class ApiConfig(ServiceConfig, kw_only=True, frozen=True):
    admin_key: str | None = None
    """The operator's key for `/v1/admin` (tenants and their keys); unset: those routes do
    not exist (404)."""
    tenant_environments_private: bool = False
    """Whether a tenant may name an HTTP environment on a private or loopback address
    (`RETRACE_API_TENANT_ENVIRONMENTS_PRIVATE`): the deployment's services would call it from
    inside its network. The operator (the admin key, the CLI on the server) always may; no
    one may name a link-local or metadata address (`shared.envs.remote.address`)."""
    events_poll_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    """How often a cycle's event stream looks at the store for changes."""
