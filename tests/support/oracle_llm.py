"""A fake OpenAI-compatible endpoint that plays each task's reference solution (or, for tasks
it is told to fail, answers with plain text). The real counterpart is `retrace serve-model`,
exercised by the model tests; this fake keeps rollout tests fast and their rewards known."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
from aiohttp import web

from shared.envs.protocol import Environment, TaskSpec
from shared.llm.openai_types import ChatRequest

HOLD_LIMIT_S = 300.0


class OracleLLM:
    def __init__(
        self,
        env: Environment,
        *,
        fail: set[str] = frozenset(),
        delay: float = 0.0,
        fail_rate: float = 0.0,
        hold: threading.Event | None = None,
        pass_first: int = 0,
    ) -> None:
        """With `hold`, the replies to all but the first `pass_first` tasks asked about (by
        their opening request) wait until it is set: a rollout that stays under way for as
        long as a test needs, however slow the machine."""
        self.references: dict[str, list[dict[str, Any]]] = {}
        self.fail = fail
        self.delay = delay
        self.hold = hold
        self.pass_first = pass_first
        self._passed: set[str] = set()
        self.calls = 0
        self.seeds: list[int | None] = []
        """The sampling seed of each episode's first request, in arrival order."""
        self.fail_rate = fail_rate
        self._rng = random.Random(0)
        for task in env.tasks():
            opening = _opening(env, task)
            self.references[opening or ""] = [] if task.id in fail else task.data["reference"]

    async def chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        req = msgspec.json.decode(await request.read(), type=ChatRequest)
        if self.delay:
            await asyncio.sleep(self.delay)
        opening = next((m.content for m in req.messages if m.role == "user"), "") or ""
        if self.hold is not None and opening not in self._passed:
            if len(self._passed) < self.pass_first:
                self._passed.add(opening)
            else:  # set by the test's thread, not this server's loop (bounded: a test
                # that fails before setting it must not leave threads waiting at exit)
                await asyncio.to_thread(self.hold.wait, HOLD_LIMIT_S)
        script = self.references.get(opening, [])
        turn = sum(1 for m in req.messages if m.role == "assistant")
        if turn == 0:
            self.seeds.append(req.seed)
        if self.fail_rate and turn == 0 and self._rng.random() < self.fail_rate:
            script = []  # this sample of the task fails: a plain refusal, no tools
        reply = (
            script[turn]
            if turn < len(script)
            else {"role": "assistant", "content": "I cannot help with that."}
        )
        message = {
            "role": "assistant",
            "content": reply.get("content"),
            "tool_calls": reply.get("tool_calls"),
        }
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return web.json_response(body)

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "oracle", "object": "model"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app


@contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Serve `app` on a free port from its own thread (for tests that block on subprocesses)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        ready.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{holder['port']}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _opening(env: Environment, task: TaskSpec) -> str | None:
    """The task's opening user message; an environment whose episodes start only
    asynchronously (MCP, HTTP) opens with the task's `prompt`."""
    if getattr(env, "areset", None) is not None:
        return str(task.data["prompt"])
    episode = env.reset(task, int(task.data.get("seed", 0)))
    return next(m.content for m in episode.messages if m.role == "user")
