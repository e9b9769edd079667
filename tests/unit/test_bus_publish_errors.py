"""A publish on a connection that gave up reconnecting is the caller's retryable error, not
an internal one (issue 14: the control API answered a 500 when NATS stayed down past the
reconnection attempts)."""

from __future__ import annotations

from typing import Any

import nats
import pytest

from shared.bus.nats_bus import NatsBus
from shared.config import NatsConfig
from shared.errors import RetryableError


class _Gone:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def jetstream(self, **_: Any) -> _Gone:
        return self

    async def publish(self, *_: Any, **__: Any) -> None:
        self.calls += 1
        raise self.error


@pytest.mark.parametrize(
    "error", [nats.errors.ConnectionClosedError(), nats.errors.ConnectionDrainingError()]
)
async def test_a_closed_connection_is_a_retryable_error_at_once(error: Exception) -> None:
    conn = _Gone(error)
    bus = NatsBus(conn, NatsConfig())  # type: ignore[arg-type]
    with pytest.raises(RetryableError, match="publish to"):
        await bus.publish_raw("retrace.x", b"{}", msg_id="m")
    assert conn.calls == 1  # not retried: it will not come back on this connection
