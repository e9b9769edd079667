"""Settings of the rollout service (`RETRACE_*` blocks, plus `RETRACE_ROLLOUT_*`)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import ServiceConfig

DEFAULT_PORT = 8101


class RolloutConfig(ServiceConfig, kw_only=True, frozen=True):
    episodes_at_once: Annotated[int, msgspec.Meta(ge=1)] = 8
    """Episodes of one request run concurrently against the inference endpoint."""
    max_turns: Annotated[int, msgspec.Meta(ge=1)] = 12
    """Assistant turns before an episode is stopped and scored as it stands."""
    endpoint_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    """Seconds a request waits for an inference endpoint that does not answer yet (starting,
    restarting) before its delivery counts as failed; the wait spends no delivery attempt."""
