"""Stopping a service while a fetch is still returning messages the server already delivered:
the fetch is let finish and its messages are handled (cancelled, it would drop them until
their ack timeout). A fake subscription holds the message for a moment, as nats-py's fetch
does between the server's delivery and its return; the real one is exercised by
tests/integration/test_service_process.py."""

from __future__ import annotations

import asyncio
from typing import Any

from shared.config import ServiceConfig
from shared.runtime.service import Service


class SlowFetch:
    """A pull subscription whose fetch holds one delivered message for 0.3 s."""

    def __init__(self) -> None:
        self.fetches = 0

    async def fetch(self, batch: int, timeout: float) -> list[str]:  # noqa: ASYNC109  nats-py shape
        self.fetches += 1
        await asyncio.sleep(0.3)
        return ["delivered"]


class Recording:
    consumer = "recording"

    def __init__(self) -> None:
        self.processed: list[Any] = []

    async def process(self, msg: Any) -> None:
        self.processed.append(msg)


async def test_a_stop_lets_a_fetch_in_progress_hand_its_messages_over() -> None:
    service = Service("drain-test", ServiceConfig(), {}, default_port=0)
    delivery, sub = Recording(), SlowFetch()
    puller = asyncio.create_task(service._pull(delivery, sub))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # inside the fetch, the message already on its way
    service.stop()
    await service._drain([puller])
    assert delivery.processed == ["delivered"] and sub.fetches == 1
    assert puller.done() and not service._tasks
