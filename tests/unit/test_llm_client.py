"""The LLM client against a small fake endpoint: retries, permanent errors, tool-call parsing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.envs.protocol import Message
from shared.llm.client import LLMClient, LLMError, LLMRequestError
from shared.llm.openai_types import ChatRequest
from shared.retry import RetryPolicy

FAST = RetryPolicy(
    "test",
    attempts=3,
    base_delay=0.001,
    max_delay=0.002,
    timeout=2.0,
    retry_on=(LLMError, asyncio.TimeoutError),
)


class Fake:
    """Answers from a script of (status, body) pairs, then repeats the last one."""

    def __init__(self, script: list[tuple[int, Any]]) -> None:
        self.script = script
        self.calls = 0
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        status, body = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(body, bytes):
            return web.Response(status=status, body=body)
        return web.json_response(body, status=status)


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[TestServer] = []

    async def start(fake: Fake) -> LLMClient:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", fake.handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return LLMClient(f"http://127.0.0.1:{server.port}", chat_retry=FAST)

    yield start
    for server in servers:
        await server.close()


REQUEST = ChatRequest(model="m", messages=[Message(role="user", content="hi")])
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


async def test_transient_errors_are_retried(serve: Any) -> None:
    fake = Fake(
        [
            (503, {"error": {"message": "busy"}}),
            (500, b"oops"),
            (200, completion({"content": "ok"})),
        ]
    )
    async with await serve(fake) as client:
        response = await client.chat(REQUEST)
    assert response.choices[0].message.content == "ok" and fake.calls == 3


async def test_client_errors_are_not_retried(serve: Any) -> None:
    fake = Fake([(400, {"error": {"message": "bad top_p"}})])
    async with await serve(fake) as client:
        with pytest.raises(LLMRequestError, match="bad top_p"):
            await client.chat(REQUEST)
    assert fake.calls == 1


async def test_retries_are_bounded(serve: Any) -> None:
    fake = Fake([(503, b"down")])
    async with await serve(fake) as client:
        with pytest.raises(LLMError):
            await client.chat(REQUEST)
    assert fake.calls == FAST.attempts


async def test_unreadable_responses_are_errors_not_crashes(serve: Any) -> None:
    fake = Fake([(200, b"{not json")])
    async with await serve(fake) as client:
        with pytest.raises(LLMError, match="unreadable"):
            await client.chat(REQUEST)


async def test_tool_calls_left_in_text_are_parsed(serve: Any) -> None:
    text = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    fake = Fake([(200, completion({"content": text}))])
    async with await serve(fake) as client:
        response = await client.chat(ChatRequest(model="m", messages=REQUEST.messages, tools=TOOLS))
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    assert [c.function.name for c in choice.message.tool_calls or []] == ["f"]


async def test_malformed_calls_in_text_are_reported(serve: Any) -> None:
    fake = Fake([(200, completion({"content": '<tool_call>{"name": "f", oops}</tool_call>'}))])
    async with await serve(fake) as client:
        response = await client.chat(ChatRequest(model="m", messages=REQUEST.messages, tools=TOOLS))
    message = response.choices[0].message
    assert (
        message.tool_calls is None
        and message.tool_call_errors
        and "not valid JSON" in message.tool_call_errors[0]
    )


async def test_admin_endpoints(serve: Any) -> None:
    fake = Fake([(200, {"object": "list", "data": [{"id": "base"}, {"id": "lora-a"}]})])
    async with await serve(fake) as client:
        assert await client.models() == ["base", "lora-a"]
        fake.script = [(200, b"Success")]
        await client.load_adapter("lora-a", "/tmp/a")
        await client.unload_adapter("lora-a")
    assert fake.paths == ["/v1/models", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]


class Slow(Fake):
    async def handle(self, request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return await super().handle(request)


async def test_only_the_retry_policy_limits_a_call(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's own session default (a 300 s total) once capped every longer request
    timeout: CPU rollouts waiting on a busy server were cut off and redone. Shrunk here to
    0.2 s, it must not end a call the policy (2 s) still allows."""
    import aiohttp.client

    monkeypatch.setattr(aiohttp.client, "DEFAULT_TIMEOUT", aiohttp.ClientTimeout(total=0.2))
    fake = Slow([(200, completion({"content": "late but fine"}))])
    async with await serve(fake) as client:
        response = await client.chat(REQUEST)
    assert response.choices[0].message.content == "late but fine" and fake.calls == 1
