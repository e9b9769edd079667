"""A caller who stops reading a stream from `serve-model` is cut off: its write waited for
ever before, holding the handler while the rows went on generating every token they were
allowed (issue 14's list after session 32: no write timeout for slow stream readers). A real
engine (the tiny Llama) behind the real server on a real port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("torch", reason="serving needs the train extra")

from aiohttp import web

from shared.serving.api import ModelServer
from shared.serving.engine import Engine
from shared.serving.prompts import PromptBuilder
from tests.integration.test_delivery import eventually
from tests.support.raw_http import sent_and_never_read
from tests.support.tiny_model import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.slow]
N, MAX_TOKENS = 8, 2000
"""Eight rows of up to 2,000 tokens: megabytes of events, far past what the sockets hold."""


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, ModelServer, Engine]]:
    tokenizer = smollm2_tokenizer()
    engine = Engine(tiny_llama(tokenizer).eval(), tokenizer, max_batch=N)
    engine.start()
    server = ModelServer(engine, PromptBuilder(tokenizer), "tiny", 4096)
    runner = web.AppRunner(server.app())
    await runner.setup()
    listening = socket.socket()
    # small send buffers (accepted sockets inherit them): the kernel would otherwise hold
    # megabytes of the stream before a write had to wait
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    await web.SockSite(runner, listening).start()
    try:
        yield port, server, engine
    finally:
        await runner.cleanup()
        engine.stop()


def _requests(server: ModelServer, status: str) -> float:
    return float(server.requests.labels("tiny", status)._value.get())


async def test_a_caller_who_stops_reading_a_stream_is_cut_off_and_its_rows_dropped(
    served: tuple[int, ModelServer, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shared.serving.api.CALLER_WRITE_S", 0.5)
    port, server, engine = served
    body = json.dumps(
        {
            "model": "tiny",
            "stream": True,
            "n": N,
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
    reader, writer = await sent_and_never_read(port, head, body)

    async def cut() -> bool:
        return _requests(server, "caller_stalled") == 1

    try:
        await eventually(cut, within=60)
        # the generation was cancelled with it: its rows left the batch long before their
        # 16,000 tokens, and nothing generates for them afterwards
        generated = engine.stats.generated_tokens
        assert generated < N * MAX_TOKENS
        await asyncio.sleep(0.5)
        assert engine.stats.generated_tokens == generated
        # the connection was aborted: what the caller reads now ends
        with contextlib.suppress(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert _requests(server, "ok") == 0
