"""A real service process: SIGKILL loses nothing, SIGTERM drains, bad config fails clearly."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.store import Store
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually
from tests.support.ping import Ping, create_effects, effect_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proc:
    """One `tests.support.ping_service` process."""

    def __init__(self, cfg: ServiceConfig, grace: float) -> None:
        self.port = _free_port()
        self.env = {
            **os.environ,
            "RETRACE_NATS_URL": cfg.nats.url or "",
            "RETRACE_NATS_SUBJECT_PREFIX": cfg.nats.subject_prefix,
            "RETRACE_NATS_STREAM_PREFIX": cfg.nats.stream_prefix,
            "RETRACE_DATABASE_URL": cfg.database.url or "",
            "RETRACE_DATABASE_SCHEMA": cfg.database.schema,
            "RETRACE_CONSUMER_ACK_WAIT": "2",
            "RETRACE_CONSUMER_MAX_DELIVER": "4",
            "RETRACE_CONSUMER_BACKOFF": "0.2",
            "RETRACE_CONSUMER_FETCH_TIMEOUT": "0.2",
            "RETRACE_CONSUMER_SHUTDOWN_GRACE": str(grace),
            "RETRACE_HTTP_PORT": str(self.port),
            "RETRACE_LOG_FORMAT": "json",
        }
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.ping_service",
            cwd=REPO,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        await eventually(self._healthy, within=30)

    async def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            out = await self.proc.stdout.read() if self.proc.stdout else b""
            raise AssertionError(f"service exited early: {out.decode()[-3000:]}")
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{self.port}/healthz") as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def wait(self, limit_s: float) -> tuple[int, str]:
        assert self.proc is not None
        out, _ = await asyncio.wait_for(self.proc.communicate(), limit_s)
        return self.proc.returncode or 0, out.decode()


@pytest.fixture
async def setup(service_cfg: ServiceConfig, store: Store) -> AsyncIterator[tuple[NatsBus, Store]]:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    await create_effects(store.engine)
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    await bus.ensure_streams()
    yield bus, store
    await bus.close()


async def _in_flight(bus: NatsBus, n: int) -> bool:
    pending = await bus.consumer_pending(f"{bus.cfg.stream_prefix}_EVENTS", "pinger-test-ping")
    return pending is not None and pending[1] == n


async def test_sigkill_loses_nothing(
    service_cfg: ServiceConfig, setup: tuple[NatsBus, Store]
) -> None:
    bus, store = setup
    first = Proc(service_cfg, grace=5)
    await first.start()
    for i in range(3):
        # Slow on the first delivery only, so the replacement finishes them quickly.
        await bus.publish("acme", Ping(key=f"k{i}", sleep=60, sleep_on=[1]), msg_id=f"kill-{i}")
    await eventually(lambda: _in_flight(bus, 3))
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)
    code, _ = await first.wait(10)
    assert code == -signal.SIGKILL
    assert await effect_counts(store.engine) == {}  # nothing committed by the dead process

    second = Proc(service_cfg, grace=5)
    await second.start()

    async def all_done() -> bool:
        return await effect_counts(store.engine) == {"k0": 1, "k1": 1, "k2": 1}

    await eventually(all_done, within=30)
    assert second.proc is not None
    second.proc.send_signal(signal.SIGTERM)
    code, out = await second.wait(20)
    assert code == 0, out[-3000:]
    assert await _in_flight(bus, 0)


async def test_sigterm_finishes_in_flight_work(
    service_cfg: ServiceConfig, setup: tuple[NatsBus, Store]
) -> None:
    bus, store = setup
    proc = Proc(service_cfg, grace=15)
    await proc.start()
    await bus.publish("acme", Ping(key="slow", sleep=2), msg_id="term-1")
    await eventually(lambda: _in_flight(bus, 1))
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    code, out = await proc.wait(30)
    assert code == 0, out[-3000:]
    assert '"service stopped"' in out
    assert await effect_counts(store.engine) == {"slow": 1}
    assert await _in_flight(bus, 0)
    info = await bus.js.consumer_info(f"{bus.cfg.stream_prefix}_EVENTS", "pinger-test-ping")
    assert info.num_redelivered == 0 and info.num_pending == 0


async def test_sigterm_past_grace_hands_work_back(
    service_cfg: ServiceConfig, setup: tuple[NatsBus, Store]
) -> None:
    bus, store = setup
    proc = Proc(service_cfg, grace=0.5)
    await proc.start()
    await bus.publish("acme", Ping(key="long", sleep=60, sleep_on=[1]), msg_id="grace-1")
    await eventually(lambda: _in_flight(bus, 1))
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    code, out = await proc.wait(20)
    assert code == 0, out[-3000:]
    assert await effect_counts(store.engine) == {}
    # The nak makes it available at once: a new instance finishes it well before ack_wait.
    replacement = Proc(service_cfg, grace=5)
    await replacement.start()
    await eventually(lambda: _count(store, "long"), within=20)
    assert replacement.proc is not None
    replacement.proc.send_signal(signal.SIGTERM)
    assert (await replacement.wait(20))[0] == 0


async def _count(store: Store, key: str) -> bool:
    return (await effect_counts(store.engine)).get(key) == 1


async def test_bad_config_exits_with_the_variable_named(service_cfg: ServiceConfig) -> None:
    proc = Proc(service_cfg, grace=5)
    proc.env["RETRACE_CONSUMER_CONCURRENCY"] = "lots"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.ping_service",
        cwd=REPO,
        env=proc.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 2
    assert "RETRACE_CONSUMER_CONCURRENCY" in out.decode()
