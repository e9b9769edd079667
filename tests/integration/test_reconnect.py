"""A running service survives a NATS restart and lost Postgres connections."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import text

from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.embedded import nats_binary
from shared.runtime.service import Service
from shared.store import Store
from shared.store.tenants import create_tenant
from tests.integration.test_delivery import eventually
from tests.support.ping import Ping, create_effects, effect_counts, handle_ping

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class OwnNats:
    """A nats-server this test may stop and start again on the same port and store."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [nats_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[OwnNats]:
    server = OwnNats(tmp_path / "js")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def service(
    own_nats: OwnNats, service_cfg: ServiceConfig, store: Store
) -> AsyncIterator[Service]:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    await create_effects(store.engine)
    cfg = msgspec.structs.replace(
        service_cfg,
        nats=msgspec.structs.replace(service_cfg.nats, url=own_nats.url, reconnect_wait=0.5),
    )
    svc = Service("pinger", cfg, {Ping: handle_ping}, default_port=0)
    task = asyncio.create_task(svc.run())
    await eventually(lambda: _ok(svc))
    yield svc
    svc.stop()
    await asyncio.wait_for(task, 30)


async def _ok(svc: Service) -> bool:
    return (await svc.health()).status == "ok"


async def _handled(store: Store, key: str) -> bool:
    return (await effect_counts(store.engine)).get(key) == 1


async def test_survives_nats_restart(own_nats: OwnNats, service: Service, store: Store) -> None:
    bus = await NatsBus.connect(own_nats.url, service.cfg.nats)
    await bus.publish("acme", Ping(key="before"), msg_id="r-1")
    await eventually(lambda: _handled(store, "before"))
    await bus.close()

    own_nats.stop()
    await eventually(lambda: _not_ok(service))
    own_nats.start()
    await eventually(lambda: _ok(service), within=30)

    bus = await NatsBus.connect(own_nats.url, service.cfg.nats)
    await bus.publish("acme", Ping(key="after"), msg_id="r-2")
    await eventually(lambda: _handled(store, "after"), within=30)
    await bus.close()


async def _not_ok(svc: Service) -> bool:
    return not await _ok(svc)


async def test_survives_lost_database_connections(
    own_nats: OwnNats, service: Service, store: Store
) -> None:
    bus = await NatsBus.connect(own_nats.url, service.cfg.nats)
    await bus.publish("acme", Ping(key="one"), msg_id="d-1")
    await eventually(lambda: _handled(store, "one"))
    # What a Postgres restart does to a pool: every connection of the service dies.
    async with store.engine.connect() as conn:
        killed = await conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = current_setting('application_name') "
                "AND datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
        )
    assert killed and killed > 0
    await bus.publish("acme", Ping(key="two"), msg_id="d-2")
    await eventually(lambda: _handled(store, "two"), within=30)
    assert (await service.health()).database
    await bus.close()
