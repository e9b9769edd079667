"""A fake OpenAI-compatible chat endpoint for unit tests of LLM callers (judge, spec writer).

Its real counterpart, `retrace serve-model`, is exercised by the model tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.llm.client import LLMClient, LLMError
from shared.retry import RetryPolicy

FAST = RetryPolicy(
    "test", attempts=2, base_delay=0.001, max_delay=0.002, timeout=5.0, retry_on=(LLMError,)
)

Answer = Callable[[dict[str, Any]], str]


class FakeJudge:
    """An OpenAI-compatible chat endpoint whose reply text comes from `answer(request body)`;
    it records every request and the most requests it ever had in flight at once."""

    def __init__(
        self,
        answer: Answer,
        delay: float = 0.0,
        top_logprobs: dict[str, float] | None = None,
    ) -> None:
        self.answer = answer
        self.delay = delay
        self.top_logprobs = top_logprobs
        """When set, the first reply token's top log-probabilities (token -> logprob)."""
        self.requests: list[dict[str, Any]] = []
        self.active = 0
        self.max_active = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.delay)
            content = self.answer(body)
        finally:
            self.active -= 1
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }
        if self.top_logprobs is not None and body.get("logprobs"):
            tops = [{"token": t, "logprob": lp} for t, lp in self.top_logprobs.items()]
            first = max(tops, key=lambda x: x["logprob"])
            choice["logprobs"] = {"content": [{**first, "top_logprobs": tops}]}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def script(*replies: str) -> Answer:
    """Answers with `replies` in order, then repeats the last."""
    calls = 0

    def answer(_: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        return replies[min(calls, len(replies)) - 1]

    return answer


def user_text(body: dict[str, Any], index: int = 1) -> str:
    return str(body["messages"][index]["content"])


Serve = Callable[[FakeJudge], Awaitable[LLMClient]]


async def serving() -> AsyncIterator[Serve]:
    """Starts fake endpoints on demand (the `serve` fixture); closes them afterwards."""
    servers: list[TestServer] = []
    clients: list[LLMClient] = []

    async def start(fake: FakeJudge) -> LLMClient:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", fake.handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        clients.append(LLMClient(f"http://127.0.0.1:{server.port}", chat_retry=FAST))
        return clients[-1]

    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()
