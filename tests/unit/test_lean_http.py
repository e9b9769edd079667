"""The load generator's lean HTTP client: it reads what an aiohttp server answers (status,
body, keep-alive, a reconnect after the server closed the connection), names what it cannot
read, and its head parser takes any status line and Content-Length or says what was wrong."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.lean_http import HttpError, LeanClient, _head


async def _server(handler: web.RequestHandler) -> TestServer:  # type: ignore[type-arg]
    app = web.Application()
    app.router.add_post("/v1/chat", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_posts_over_one_connection_and_reads_each_reply() -> None:
    seen: list[tuple[bytes, str | None, int]] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen.append((body, request.headers.get("Authorization"), peer[1] if peer else 0))
        status = 200 if body != b'{"fail":true}' else 429
        return web.Response(body=body[::-1], status=status, content_type="application/json")

    server = await _server(echo)
    client = LeanClient(f"http://127.0.0.1:{server.port}/v1/chat", {"Authorization": "Bearer k"})
    try:
        big = b'{"x":"' + b"y" * 300_000 + b'"}'  # many reads for one reply
        for body in (b'{"a":1}', big, b'{"fail":true}', b"{}"):
            status, reply = await client.post(body)
            assert reply == body[::-1]
            assert status == (429 if body == b'{"fail":true}' else 200)
    finally:
        client.close()
        await server.close()
    assert [b for b, _, _ in seen][:2] == [b'{"a":1}', big]
    assert {auth for _, auth, _ in seen} == {"Bearer k"}
    assert len({port for _, _, port in seen}) == 1  # kept alive


async def test_a_connection_the_server_closed_is_opened_again() -> None:
    async def closing(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok", headers={"Connection": "close"})

    server = await _server(closing)
    client = LeanClient(f"http://127.0.0.1:{server.port}/v1/chat")
    try:
        for _ in range(3):
            assert await client.post(b"{}") == (200, b"ok")
            await asyncio.sleep(0.05)  # the close arrives
    finally:
        client.close()
        await server.close()


async def test_a_chunked_reply_is_an_error_not_a_hang() -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"part")
        await response.write_eof()
        return response

    server = await _server(chunked)
    client = LeanClient(f"http://127.0.0.1:{server.port}/v1/chat")
    try:
        with pytest.raises(HttpError, match="Content-Length"):
            await asyncio.wait_for(client.post(b"{}"), 5)
    finally:
        client.close()
        await server.close()


def test_only_http_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="http://"):
        LeanClient("https://example.com/x")


@given(
    status=st.integers(100, 599),
    length=st.integers(0, 10**9),
    others=st.lists(
        st.tuples(
            st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
                lambda n: n != "content-length"
            ),
            st.text("abc 012;=/", max_size=20),
        ),
        max_size=5,
    ),
    case=st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH"]),
)
def test_any_reply_head_gives_its_status_and_length(
    status: int, length: int, others: list[tuple[str, str]], case: str
) -> None:
    lines = [f"HTTP/1.1 {status} Whatever"] + [f"{k}: {v}" for k, v in others]
    lines.insert(1 + len(others) // 2, f"{case}: {length}")
    assert _head("\r\n".join(lines).encode()) == (status, length)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"SPDY/3 200 OK\r\nContent-Length: 1", "status line"),
        (b"HTTP/1.1 abc OK\r\nContent-Length: 1", "status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1x", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", "without a Content-Length"),
    ],
)
def test_a_head_it_cannot_read_is_named(head: bytes, message: str) -> None:
    with pytest.raises(HttpError, match=message):
        _head(head)


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_the_load_generator_counts_what_the_server_answered(client: str) -> None:
    """`router_overhead.load` with either client: each request a conversation's turn with the
    key, every answer counted once, a refused one as failed."""
    from benchmarks.router_overhead import load

    bodies: list[dict[str, object]] = []

    async def answer(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == "Bearer k"
        body = await request.json()
        bodies.append(body)
        status = 503 if len(bodies) % 5 == 0 else 200
        return web.json_response({"ok": True}, status=status)

    server = await _server(answer)
    try:
        got = await load(
            f"http://127.0.0.1:{server.port}/v1/chat", "k", 3, 0.3, turns=2, client=client
        )
    finally:
        await server.close()
    assert got["requests"] + got["failed"] == len(bodies) > 10
    assert got["failed"] == len(bodies) // 5
    assert {b["model"] for b in bodies} == {"bot"}
    turns = [len(b["messages"]) for b in bodies]  # type: ignore[arg-type]
    assert min(turns) < max(turns)  # openings and continued turns both sent
