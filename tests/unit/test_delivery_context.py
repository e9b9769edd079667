"""What a handler gets from the delivery: a heartbeat it may call at will."""

from __future__ import annotations

from shared.bus.delivery import Delivery, HandlerContext
from shared.config import ConsumerConfig
from shared.messages import RolloutRequested


class LostConnection:
    """A delivered message whose connection to NATS is gone."""

    subject = "rt.acme.rollout.requested"

    async def in_progress(self) -> None:
        raise ConnectionResetError("nats connection lost")


async def _nothing(_: object, __: HandlerContext) -> None:
    return None


async def test_a_handler_heartbeat_that_cannot_be_sent_does_not_raise() -> None:
    """A handler that heartbeats while it waits (the rollout service waiting for its model
    server) must not fail because NATS is briefly unreachable: JetStream redelivers anyway."""
    delivery = Delivery(
        "c",
        RolloutRequested,
        _nothing,
        None,
        None,
        ConsumerConfig(),
        None,  # type: ignore[arg-type]
    )
    ctx = delivery._context(LostConnection(), "acme", None, "m", 1)  # type: ignore[arg-type]
    await ctx.heartbeat()
