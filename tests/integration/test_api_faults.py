"""The control API while its NATS is really down (issue 14's fault cases; the other test of
this kept NATS up and refused the publish in Python): starting a cycle is a 503 with
Retry-After whose row waits, and the same request once NATS is back publishes it once.

The code before this test already gave the 503 here (the publish times out while the client
reconnects). What it found, with NATS down past the reconnection attempts (a 500: the
connection closed for good), is pinned by `tests/unit/test_bus_publish_errors.py`."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import aiohttp
import msgspec
import nats
import pytest

from services.api.config import ApiConfig
from services.api.service import build
from shared.config import ServiceConfig
from shared.store import Store
from shared.store.models import Cycle
from shared.store.tenants import create_tenant, issue_api_key
from tests.integration.test_delivery import eventually, healthy
from tests.integration.test_router_faults import Nats

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def _messages(url: str, prefix: str) -> int:
    """Messages in the test's streams."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        total = 0
        for kind in ("EVENTS", "WORK"):
            total += (await js.stream_info(f"{prefix}_{kind}")).state.messages
        return total
    finally:
        await nc.close()


async def test_a_cycle_started_while_nats_is_down_is_a_503_then_published_once(
    service_cfg: ServiceConfig, store: Store, tmp_path: Path
) -> None:
    server = Nats(tmp_path / "nats")
    server.start()
    bus = msgspec.structs.replace(service_cfg.nats, url=server.url)
    fields = {f: getattr(service_cfg, f) for f in ServiceConfig.__struct_fields__}
    cfg = ApiConfig(**{**fields, "nats": bus})
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        key = await issue_api_key(session, "acme")
    service = build(cfg)
    run = asyncio.create_task(service.run())
    headers = {"Authorization": f"Bearer {key}"}
    try:
        await eventually(lambda: healthy(service), within=60)
        url = f"http://127.0.0.1:{service.bound_port}"
        async with aiohttp.ClientSession(headers=headers) as http:
            agent = {"name": "bot", "model": "m", "environment": "toolbox"}
            async with http.post(f"{url}/v1/agents", json=agent) as r:
                assert r.status == 201, await r.text()
            before = await _messages(server.url, bus.stream_prefix)
            server.kill()
            start = {"cycle_id": str(uuid.uuid4())}
            async with http.post(f"{url}/v1/agents/bot/cycles", json=start) as r:
                refused = await r.json()
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1, refused
                assert refused["error"]["code"] == 503 and refused["error"]["type"]
            async with store.tenant("acme") as session:
                row = await session.get(Cycle, uuid.UUID(start["cycle_id"]))
                assert row is not None and row.state == "requested"
            server.start()  # the same port and store: the streams are still there
            await eventually(lambda: healthy(service), within=60)
            async with http.post(f"{url}/v1/agents/bot/cycles", json=start) as r:
                assert r.status == 202, await r.text()
                assert (await r.json())["id"] == start["cycle_id"]
            assert await _messages(server.url, bus.stream_prefix) == before + 1
    finally:
        service.stop()
        await run
        server.kill()


async def test_the_store_down_is_a_503_with_retry_after_and_nothing_half_written(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """Postgres out of reach (every connection through a forwarder dropped, new ones
    refused; the server itself is shared and stays up): each route answers a 503 in the
    OpenAI shape with Retry-After, an agent asked for meanwhile is not half made, and the
    API serves again once the store is back."""
    from sqlalchemy import func, select
    from sqlalchemy.engine import make_url

    from shared.store.models import Agent
    from tests.support.tcp_proxy import TcpProxy

    url = make_url(service_cfg.database.url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    database = msgspec.structs.replace(service_cfg.database, url=through)
    fields = {f: getattr(service_cfg, f) for f in ServiceConfig.__struct_fields__}
    service = build(ApiConfig(**{**fields, "database": database}))
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        key = await issue_api_key(session, "acme")
    run = asyncio.create_task(service.run())

    async def agents() -> int:
        async with store.tenant("acme") as session:
            return int(await session.scalar(select(func.count()).select_from(Agent)) or 0)

    try:
        await eventually(lambda: healthy(service), within=60)
        api = f"http://127.0.0.1:{service.bound_port}/v1"
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            made = {"name": "bot", "model": "m", "environment": "toolbox"}
            async with http.post(f"{api}/agents", json=made) as r:
                assert r.status == 201, await r.text()
            await proxy.cut()
            for method, path, body in (
                ("GET", "/agents", None),
                ("POST", "/agents", {**made, "name": "bot-2"}),
                ("GET", "/keys", None),
            ):
                async with http.request(method, api + path, json=body) as r:
                    refused = await r.json()
                    assert r.status == 503 and int(r.headers["Retry-After"]) >= 1, refused
                    assert refused["error"]["code"] == 503, refused
            await proxy.restore()

            async def serving() -> bool:
                async with http.get(f"{api}/agents") as r:
                    return r.status == 200

            await eventually(serving, within=30)
        assert await agents() == 1  # bot, and no half of bot-2
    finally:
        service.stop()
        await run
        await proxy.close()
