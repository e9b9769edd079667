"""The router's own HTTP/1.1 client to the model server (services/router/upstream.py),
against servers on real sockets that answer as servers do and as broken ones do."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.router.upstream import HIGH_WATER, Upstream, UpstreamBusyError, UpstreamError

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Given a request (head and body), writes a reply; False: close the connection after."""


class Server:
    """A TCP server that reads each HTTP/1.1 request on a connection and answers it with
    `answer`; it records the requests and counts the connections."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def sends(raw: bytes, *, keep: bool = True) -> Answer:
    """An answer of these bytes to every request; `keep` False: the connection closed after."""

    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return answer


def reply(body: bytes, status: int = 200) -> Answer:
    return sends(b"HTTP/1.1 %d OK\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body)


async def test_a_reply_read_whole_and_the_connection_kept() -> None:
    async with Server(reply(b'{"ok": true}')) as server:
        up = Upstream(server.url, headers={"Authorization": "Bearer k"})
        for _ in range(3):
            assert await up.post("/chat/completions", b'{"a": 1}') == (200, b'{"ok": true}')
        await up.close()
    assert server.connections == 1
    head, body = server.requests[0].split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Authorization: Bearer k" in lines and b"Content-Length: 8" in lines
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)
    assert body == b'{"a": 1}'


async def test_concurrent_requests_each_get_their_own_reply() -> None:
    async def echo(request: bytes, writer: asyncio.StreamWriter) -> bool:
        body = request.split(b"\r\n\r\n", 1)[1]
        await asyncio.sleep(0.01)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return True

    async with Server(echo) as server:
        up = Upstream(server.url, limit=4)
        bodies = [b"%d" % n for n in range(20)]
        got = await asyncio.gather(*(up.post("/x", b) for b in bodies))
        await up.close()
    assert [body for _, body in got] == bodies
    assert server.connections <= 4  # the limit holds; the rest waited for a connection


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=8),
    chunked=st.booleans(),
)
def test_a_body_however_it_is_framed_and_split_arrives_whole(
    body: bytes, cuts: list[int], chunked: bool
) -> None:
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        if chunked:
            out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            rest = body
            for cut in [*cuts, len(rest)]:
                piece, rest = rest[:cut], rest[cut:]
                if piece:
                    out += b"%x\r\n" % len(piece) + piece + b"\r\n"
            out += b"0\r\n\r\n"
        else:
            out = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        at = 0
        for cut in cuts:  # the bytes reach the client in pieces
            writer.write(out[at : at + cut])
            await writer.drain()
            await asyncio.sleep(0)
            at += cut
        writer.write(out[at:])
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            up = Upstream(server.url)
            assert await up.post("/x", b"{}") == (200, body)
            assert await up.post("/x", b"{}") == (200, body)
            await up.close()
        assert server.connections == 1

    asyncio.run(run())


async def test_a_body_that_ends_with_the_connection() -> None:
    answer = sends(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", keep=False)
    async with Server(answer) as server:
        up = Upstream(server.url)
        assert await up.post("/x", b"{}") == (200, b"all of it")
        assert await up.post("/x", b"{}") == (200, b"all of it")  # on a new connection
        await up.close()
    assert server.connections == 2


async def test_a_reply_that_says_close_is_the_connections_last() -> None:
    # and the server goes on reading: only the client's keeping to it is tested
    says_close = sends(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    async with Server(says_close) as server:
        up = Upstream(server.url)
        assert await up.post("/x", b"{}") == (200, b"ok")
        assert await up.post("/x", b"{}") == (200, b"ok")
        await up.close()
    assert server.connections == 2


async def test_a_streamed_reply_comes_as_it_is_sent() -> None:
    go_on = asyncio.Event()

    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"7\r\ndata: 1\r\n")
        await writer.drain()
        await go_on.wait()  # the rest only once the client has the first piece
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await writer.drain()
        return True

    async with Server(answer) as server:
        up = Upstream(server.url)
        async with up.stream("/x", b"{}") as got:
            assert got.status == 200
            pieces = []
            async for chunk in got.chunks():
                pieces.append(chunk)
                go_on.set()
        assert pieces == [b"data: 1", b"data: 2"]
        await up.close()


async def test_a_reply_larger_than_the_buffer_is_read_whole() -> None:
    big = bytes(range(256)) * (3 * HIGH_WATER // 256)

    async with Server(reply(big)) as server:
        up = Upstream(server.url)
        async with up.stream("/x", b"{}") as got:
            read = []
            async for chunk in got.chunks():
                read.append(chunk)
                await asyncio.sleep(0)  # a slow reader: the connection pauses and resumes
        assert b"".join(read) == big
        assert await up.post("/x", b"{}") == (200, big)
        await up.close()
    assert server.connections == 1


async def test_an_idle_connection_the_server_closed_is_not_an_error() -> None:
    # closes the connection, keep-alive notwithstanding (vLLM after 5 s)
    once = sends(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", keep=False)
    async with Server(once) as server:
        up = Upstream(server.url)
        assert await up.post("/x", b"{}") == (200, b"ok")
        await asyncio.sleep(0.05)
        assert await up.post("/x", b"{}") == (200, b"ok")
        await up.close()
    assert server.connections == 2 and len(server.requests) == 2


async def test_a_reused_connection_closed_before_its_reply_began_is_tried_once_more() -> None:
    """The race the retry is for: a connection taken from the pool as the server closed
    it. A reused connection that ends before a byte of the reply is sent again on a new
    one (a chat request does nothing but generate)."""
    served = 0

    async def second_hangs_up(_: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal served
        served += 1
        if served == 2:
            return False
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return True

    async with Server(second_hangs_up) as server:
        up = Upstream(server.url)
        assert await up.post("/x", b"{}") == (200, b"ok")
        assert await up.post("/x", b"{}") == (200, b"ok")
        await up.close()
    assert server.connections == 2 and len(server.requests) == 3


async def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry() -> None:
    async def hang_up(_: bytes, writer: asyncio.StreamWriter) -> bool:
        return False

    async with Server(hang_up) as server:
        up = Upstream(server.url)
        with pytest.raises(UpstreamError, match="closed the connection before it answered"):
            await up.post("/x", b"{}")
        await up.close()
    assert len(server.requests) == 1  # sent once: the server may have acted on it


async def test_a_reply_broken_off_midway_is_an_error() -> None:
    half = sends(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", keep=False)
    async with Server(half) as server:
        up = Upstream(server.url)
        with pytest.raises(UpstreamError, match="closed the connection in its reply"):
            await up.post("/x", b"{}")
        async with up.stream("/x", b"{}") as got:
            assert got.status == 200
            with pytest.raises(UpstreamError):
                async for _ in got.chunks():
                    pass
        await up.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"not http at all\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    ],
)
async def test_a_reply_that_is_not_http_is_an_error(garbage: bytes) -> None:
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(garbage)
        await writer.drain()
        await asyncio.sleep(1)
        return False

    async with Server(answer) as server:
        up = Upstream(server.url)
        with pytest.raises(UpstreamError, match=r"not HTTP/1\.1"):
            await up.post("/x", b"{}")
        await up.close()


async def test_a_server_that_does_not_answer_in_time_is_a_timeout_and_its_connection_goes() -> None:
    answered = 0

    async def slow_first(_: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal answered
        answered += 1
        if answered == 1:
            await asyncio.sleep(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return True

    async with Server(slow_first) as server:
        up = Upstream(server.url, timeout=0.2)
        with pytest.raises(TimeoutError):
            await up.post("/x", b"{}")
        assert not up._idle  # its late reply must not be taken for the next request's
        assert await up.post("/x", b"{}") == (200, b"ok")
        await up.close()
    assert server.connections == 2


async def test_nothing_listening_is_an_error_that_names_the_address() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    up = Upstream(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(
        UpstreamError, match=f"cannot connect to the model server at 127.0.0.1:{port}"
    ):
        await up.post("/x", b"{}")


async def test_data_no_request_asked_for_closes_the_connection() -> None:
    async def chatty(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
        await writer.drain()
        return True

    async with Server(chatty) as server:
        up = Upstream(server.url)
        assert await up.post("/x", b"{}") == (200, b"ok")
        await asyncio.sleep(0.1)
        assert await up.post("/x", b"{}") == (200, b"ok")  # not the stale reply
        await up.close()
    assert server.connections == 2


@pytest.mark.parametrize("url", ["ftp://host/v1", "http:///v1", "localhost:8000"])
def test_an_address_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Upstream(url)


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        Upstream("http://h/v1", headers={"Authorization": "Bearer k\r\nX-Evil: 1"})


async def test_a_request_waits_for_a_connection_only_within_its_time_limit() -> None:
    """Session 32's review: a request that found every connection in use waited for one
    outside its time limit, so it could wait a whole request's limit and then its own."""
    async with Server(reply(b"ok")) as server:
        up = Upstream(server.url, timeout=0.3, limit=1)
        async with up.stream("/x", b"{}") as held:  # the one connection, held
            assert held.status == 200
            began = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamBusyError, match="all 1 connections"):
                await up.post("/x", b"{}")
            assert asyncio.get_running_loop().time() - began < 5  # unbounded, it hung
        assert await up.post("/x", b"{}") == (200, b"ok")  # given back
        await up.close()
