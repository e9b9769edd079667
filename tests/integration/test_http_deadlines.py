"""Clients that open connections and send nothing, half their headers, or a body that never
ends are cut off: the router and the model server close such connections after their idle
timeout and answer a late body with a 408 in the OpenAI shape (issue 14: 150 half-open
connections held the router, 200 of 200 the model server, past 60 s)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from shared.config import HttpConfig, ModelConfig, ServiceConfig
from shared.runtime.deadlines import CallerStalled, end_within, write_within
from shared.runtime.http import listen
from shared.serving.api import ModelServer
from shared.store import Store
from shared.store.tenants import create_tenant, issue_api_key
from tests.integration.test_router_service import _free_port, _started

IDLE_S = 0.5
BODY_S = 0.5
HALF_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection (EOF, nothing sent) within `within` s."""
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except TimeoutError:
        return False


async def _check_cut_off(port: int, headers: dict[str, str], path: str) -> None:
    # idle and half-sent connections, several of each
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]
    for i, (_, writer) in enumerate(opened):
        if i % 2:
            writer.write(HALF_HEADERS)
            await writer.drain()
    started = time.monotonic()
    closed = await asyncio.gather(*(_closed_by_server(r, IDLE_S + 5) for r, _ in opened))
    assert all(closed), closed
    assert time.monotonic() - started < IDLE_S + 5
    for _, writer in opened:
        writer.close()

    # a body announced at 100 bytes that stops at 10
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
        f"Content-Length: 100\r\n\r\n".encode()
        + b'{"model": '
    )
    await writer.drain()
    # the answer, read by its length (the server may then linger on the unread body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BODY_S + 5)
    status_line, *fields = head.decode().split("\r\n")
    assert " 408 " in status_line, head
    length = next(int(f.split(":")[1]) for f in fields if f.lower().startswith("content-length"))
    body = json.loads(await reader.readexactly(length))
    writer.close()
    assert body["error"]["code"] == 408 and "did not arrive" in body["error"]["message"]


def _model_server() -> ModelServer:
    # the routes only: a stand-in for the engine, whose real counterpart the model tests load;
    # a body that never arrives is refused before anything reaches it
    embeddings = SimpleNamespace(num_embeddings=10)
    engine: Any = SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: embeddings))
    return ModelServer(engine, None, "m", 8, body_timeout_s=BODY_S)  # type: ignore[arg-type]


async def test_the_model_server_cuts_off_idle_connections_and_late_bodies() -> None:
    runner = await listen(_model_server().app(), "127.0.0.1", 0, idle_timeout_s=IDLE_S)
    try:
        port = int(runner.addresses[0][1])
        await _check_cut_off(port, {}, "/v1/chat/completions")
        async with (  # and it still serves
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/openapi.json") as r,
        ):
            assert r.status == 200
    finally:
        await runner.cleanup()


async def test_the_router_cuts_off_idle_connections_and_late_bodies(
    service_cfg: ServiceConfig, store: Store
) -> None:
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        key = await issue_api_key(session, "acme")
    service, run, port = await _started(
        service_cfg,
        ModelConfig(url="http://127.0.0.1:9/v1"),
        HttpConfig(port=_free_port(), idle_timeout_s=IDLE_S, body_timeout_s=BODY_S),
        mode="base",
    )
    try:
        await _check_cut_off(port, {"Authorization": f"Bearer {key}"}, "/v1/chat/completions")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as r,
        ):
            assert r.status == 200
    finally:
        service.stop()
        await run


async def test_a_shutdown_grace_of_zero_does_not_wait_forever() -> None:
    """aiohttp reads a shutdown timeout of 0 as no limit: `RETRACE_CONSUMER_SHUTDOWN_GRACE=0`
    kept a stopping service waiting on its longest request (a stream) for as long as it ran."""
    started = asyncio.Event()

    async def endless(_: Any) -> Any:
        started.set()
        await asyncio.sleep(3600)

    app = aiohttp.web.Application()
    app.router.add_get("/", endless)
    runner = await listen(app, "127.0.0.1", 0, idle_timeout_s=IDLE_S, shutdown_timeout=0)
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as http:
        pending = asyncio.ensure_future(http.get(f"http://127.0.0.1:{port}/"))
        await asyncio.wait_for(started.wait(), 5)
        began = time.monotonic()
        await asyncio.wait_for(runner.cleanup(), 10)
        assert time.monotonic() - began < 5
        pending.cancel()


async def test_the_control_api_cuts_off_idle_connections_and_late_bodies(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """Its handlers and the console's sign-in (which takes no key) read bodies with no time
    limit: a body sent a byte at a time held a connection and a handler for as long as the
    client liked."""
    from services.api.config import ApiConfig
    from services.api.service import build
    from tests.integration.test_delivery import eventually, healthy

    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        key = await issue_api_key(session, "acme")
    fields = {f: getattr(service_cfg, f) for f in ServiceConfig.__struct_fields__}
    fields["http"] = HttpConfig(port=_free_port(), idle_timeout_s=IDLE_S, body_timeout_s=BODY_S)
    service = build(ApiConfig(**fields))
    run = asyncio.create_task(service.run())
    try:
        await eventually(lambda: healthy(service))
        port = service.bound_port
        assert port is not None
        await _check_cut_off(port, {"Authorization": f"Bearer {key}"}, "/v1/agents")
        await _check_cut_off(port, {}, "/console/login")
    finally:
        service.stop()
        await run


async def test_a_stream_s_end_waits_for_its_caller_no_longer_than_its_pieces() -> None:
    """Session 33's review: aiohttp waits on the socket only once tens of KiB were written
    since its last wait, so every piece of a stream could go out at once with the socket
    full, and the end (`write_eof`) then waited for ever on a caller who read nothing."""
    ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def stream(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        try:
            for size in (66 * 1024, 10 * 1024):  # the first fills the buffer, the second waits not
                await write_within(request, out, b"x" * size, 0.5)
            await end_within(request, out, 0.5)
            ended.set_result("ended")
        except CallerStalled:
            ended.set_result("cut off")
        return out

    app = web.Application()
    app.router.add_get("/", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    listening = socket.socket()
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # accepted sockets inherit it
    listening.bind(("127.0.0.1", 0))
    await web.SockSite(runner, listening).start()
    caller = socket.socket()
    caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    caller.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(caller, listening.getsockname())
        await asyncio.get_running_loop().sock_sendall(caller, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(ended, 10) == "cut off"  # and nothing read
    finally:
        caller.close()
        await runner.cleanup()
