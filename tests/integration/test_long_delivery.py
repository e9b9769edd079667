"""Long handlers on a real NATS and Postgres: no transaction while they work, their result
recorded once with the message, retried without double effects, never run again once
recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.store import Store
from tests.integration.test_delivery import _pong_count, _pong_ids, eventually, pinger
from tests.support.ping import (
    LongPing,
    effect_counts,
    handle_long_ping,
    long_runs,
    long_working,
)
from tests.support.transactions import database_now, open_transactions

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client(service_cfg: ServiceConfig, store: Store) -> AsyncIterator[NatsBus]:
    async with pinger(service_cfg, store, {LongPing: handle_long_ping}):
        bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
        yield bus
        await bus.close()


async def test_no_transaction_is_open_while_a_long_handler_works(
    client: NatsBus, store: Store
) -> None:
    key = "work-a"
    long_working[key] = asyncio.Event()
    await client.publish("acme", LongPing(key=key, work_s=3.0), msg_id="m-work-a")
    await asyncio.wait_for(long_working[key].wait(), 20)
    began = await database_now(store)  # one held through the work began before this
    await asyncio.sleep(0.5)
    assert long_working[key].is_set()  # still at work
    assert await open_transactions(store, begun_before=began) == 0
    await eventually(lambda: _pong_count(client, 1))
    assert (await effect_counts(store.engine))[key] == 1


async def test_a_crash_before_the_record_is_retried_once_in_effect(
    client: NatsBus, store: Store
) -> None:
    key = "crash-b"
    await client.publish("acme", LongPing(key=key, crash_on=[1, 2]), msg_id="m-crash-b")
    await eventually(lambda: _pong_count(client, 1))
    assert long_runs[key] == 3
    assert (await effect_counts(store.engine))[key] == 1


@pytest.mark.parametrize("records", [True, False], ids=["recorded", "recorded-on-return"])
async def test_a_recorded_message_is_never_run_again(
    client: NatsBus, store: Store, records: bool
) -> None:
    key = f"again-{records}"
    message = LongPing(key=key, record=records)
    await client.publish("acme", message, msg_id=f"m-{key}")
    await eventually(lambda: _pong_count(client, 1))
    # past the duplicate window the same id is stored again, as after a lost ack
    await asyncio.sleep(client.cfg.duplicate_window + 0.5)
    await client.publish("acme", message, msg_id=f"m-{key}")
    await eventually(lambda: _pong_count(client, 2))  # the stored outbox, published again
    assert long_runs[key] == 1
    assert len(set(await _pong_ids(client))) == 1
    assert (await effect_counts(store.engine)).get(key, 0) == (1 if records else 0)


async def test_a_redelivery_while_the_handler_still_works_is_not_run_beside_it(
    client: NatsBus, store: Store, service_cfg: ServiceConfig
) -> None:
    """The handler holds the event loop past ack_wait (as a training step on a loaded CPU did
    in CI): JetStream redelivers while it still works. The redelivery follows the running
    delivery instead of starting the handler again (two trainings of one job at once)."""
    key = "busy-loop"
    block = service_cfg.consumer.ack_wait + 1.0
    await client.publish("acme", LongPing(key=key, block_s=block, work_s=3.0), msg_id="m-busy")
    await eventually(lambda: _pong_count(client, 1), within=30)
    await asyncio.sleep(block)  # past another ack_wait: nothing is left to redeliver
    assert long_runs[key] == 1
    assert (await effect_counts(store.engine))[key] == 1
    assert len(await _pong_ids(client)) == 1
