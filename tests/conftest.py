"""Fixtures: real NATS and Postgres, with a fresh schema and fresh stream names per test."""

from __future__ import annotations

import contextlib
import os

# Set before any test imports PyTorch (its OpenMP reads it once), and inherited by every
# process a test starts: OpenMP's threads sleep when their work is done instead of spinning
# for more. The run's 4 workers and the services they start share 2 cores: the model tests
# took 104 s instead of 137 on 2 workers, and the promotion e2e 378 s instead of 629 in the
# whole run (session 18). Alone on the cores that e2e was slower with it (215 s against 178,
# one run each), so the services keep OpenMP's default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from shared.config import ConsumerConfig, DatabaseConfig, HttpConfig, NatsConfig, ServiceConfig
from shared.runtime.service import Service
from shared.store import Store
from shared.store.engine import async_url
from shared.store.migrate import upgrade_async
from tests.support import infra

MODEL_GROUP = "model"
"""The xdist group of the tests that load a real model (the README's run, `-n 4 --dist
loadgroup`): one worker runs them one after another, in collection order, while the others
run the rest, which mostly wait on servers and subprocesses (the integration tests alone
kept the 2 cores 40% busy on 2 workers). Dealt to every worker, the model tests shared the
cores with each other as well."""
CYCLE_GROUP = "model-cycle"
"""The whole cycle with a real model (the promotion e2e, the longest test by far): a group
of its own, on a worker beside the other model tests. In the model group it made that
worker the run's tail: the whole run took 16m43s, with it on its own 12m58s (session 30's
machine, docs/benchmarks.md)."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The model tests in their xdist groups, and first (the whole cycle first of all): the
    longest units of work start at once instead of being the last worker's tail (xdist
    deals the groups out in this order, one to a worker; it is the order without xdist
    too)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("model") is None:
            return 2
        return 0 if item.get_closest_marker("e2e") is not None else 1

    for item in items:
        if rank(item) < 2:
            group = CYCLE_GROUP if rank(item) == 0 else MODEL_GROUP
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=rank)


@pytest.fixture(scope="session")
def nats_url() -> str:
    return infra.nats_url()


@pytest.fixture(scope="session")
def database_url() -> str:
    return infra.database_url()


@pytest.fixture
async def schema(database_url: str) -> AsyncIterator[str]:
    """An empty schema of its own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_async_engine(async_url(database_url))
    try:
        yield name
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        await engine.dispose()


@pytest.fixture
async def migrated(database_url: str, schema: str) -> str:
    await upgrade_async(database_url, schema)
    return schema


@pytest.fixture
def db_cfg(migrated: str) -> DatabaseConfig:
    return DatabaseConfig(schema=migrated, pool_size=3)


@pytest.fixture
async def store(database_url: str, db_cfg: DatabaseConfig) -> AsyncIterator[Store]:
    s = Store.connect(db_cfg, database_url)
    yield s
    await s.close()


@pytest.fixture
async def nats_cfg(nats_url: str) -> AsyncIterator[NatsConfig]:
    """Unique subject and stream prefixes; the streams are deleted afterwards."""
    tag = uuid.uuid4().hex[:10]
    cfg = NatsConfig(
        url=nats_url,
        subject_prefix=f"rt{tag}",
        stream_prefix=f"RT{tag.upper()}",
        duplicate_window=2.0,
    )
    yield cfg
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for kind in ("EVENTS", "WORK", "DLQ"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(f"{cfg.stream_prefix}_{kind}")
    await nc.close()


@pytest.fixture
def service_cfg(
    nats_cfg: NatsConfig, db_cfg: DatabaseConfig, database_url: str, tmp_path
) -> ServiceConfig:
    return ServiceConfig(
        nats=nats_cfg,
        database=DatabaseConfig(url=database_url, schema=db_cfg.schema, pool_size=3),
        consumer=ConsumerConfig(
            concurrency=4,
            ack_wait=2.0,
            max_deliver=3,
            backoff=[0.2, 0.2],
            shutdown_grace=5.0,
            fetch_timeout=0.2,
        ),
        http=HttpConfig(port=0),  # a free one in tests (`_services_on_free_ports`)
    )


@pytest.fixture(autouse=True)
def _services_on_free_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Port 0 is each service's default port: a test on the other xdist worker starting the
    same service would bind it at the same time. In tests, a service given 0 takes a free
    port instead (`service.port`, `service.bound_port`)."""
    built = Service.__init__

    def init(self: Service, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        if self.cfg.http.port == 0:
            self.port = free_port()

    monkeypatch.setattr(Service, "__init__", init)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
