"""An endpoint that forgot an adapter (a restart) gets it loaded again from the store before
it is used; an unknown model is refused with what the endpoint serves."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from shared.errors import PermanentError
from shared.llm.adapters import Served, artifact_of
from shared.llm.client import LLMClient
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Adapter
from shared.store.tenants import create_tenant


async def _endpoint(served: list[str], load: Handler) -> TestServer:
    """An inference endpoint that lists `served` and loads adapters with `load`."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m} for m in served]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/load_lora_adapter", load)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_forgotten_adapter_is_loaded_again(store: Store) -> None:
    served = ["smollm2"]
    loads: list[dict[str, str]] = []

    async def load(request: web.Request) -> web.Response:
        body = await request.json()
        loads.append(body)
        served.append(body["lora_name"])
        return web.Response(text="ok")

    server = await _endpoint(served, load)
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        session.add(
            Adapter(
                agent_id=agent.id,
                name="bot--alarms--v1",
                base_model="smollm2",
                artifact_uri="/artifacts/alarms/v1",
            )
        )
    async with LLMClient(f"http://127.0.0.1:{server.port}") as client:
        ensure = Served(client, ttl_s=60).ensure
        async with store.tenant("acme") as session:
            assert await artifact_of(session, "smollm2") is None
            alarms = await artifact_of(session, "bot--alarms--v1")
            assert await artifact_of(session, "ghost") is None
        assert alarms == "/artifacts/alarms/v1"
        await ensure("smollm2", None)
        await ensure("bot--alarms--v1", alarms)
        await ensure("bot--alarms--v1", alarms)  # now served: no second load
        with pytest.raises(PermanentError, match=r"serves .*not 'ghost'"):
            await ensure("ghost", None)
    await server.close()
    assert loads == [{"lora_name": "bot--alarms--v1", "lora_path": "/artifacts/alarms/v1"}]


async def test_two_first_requests_for_an_adapter_both_find_it_served() -> None:
    """Session 32's review: two requests that found an adapter unloaded both asked the
    endpoint to load it; the second load was refused ("already loaded", as vLLM and
    serve-model answer) and its request failed with a 502."""
    served = ["smollm2"]
    loading = asyncio.Event()

    pending: set[str] = set()

    async def load(request: web.Request) -> web.Response:
        body = await request.json()
        name = body["lora_name"]
        if name in served or name in pending:
            raise web.HTTPBadRequest(text=f"adapter {name!r} is already loaded")
        pending.add(name)
        loading.set()
        await asyncio.sleep(0.5)  # the second request is refused meanwhile
        served.append(name)
        return web.Response(text="ok")

    server = await _endpoint(served, load)
    async with LLMClient(f"http://127.0.0.1:{server.port}") as client:
        one, two = Served(client, ttl_s=60), Served(client, ttl_s=60)  # two processes
        first = asyncio.create_task(one.ensure("acme--new--v1", "/artifacts/new"))
        await loading.wait()
        await two.ensure("acme--new--v1", "/artifacts/new")  # the endpoint says "already"
        await first
    await server.close()
