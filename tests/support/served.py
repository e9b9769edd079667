"""aiohttp apps served on a real port: with an LLM client, as the services reach an endpoint,
or on a thread of their own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.llm.client import LLMClient
from shared.runtime.http import listen


@asynccontextmanager
async def client_on(app: web.Application, **options: Any) -> AsyncIterator[LLMClient]:
    """An LLM client (`options`: LLMClient's) of `app` on a real port."""
    server = TestServer(app)
    await server.start_server()
    try:
        async with LLMClient(f"http://127.0.0.1:{server.port}", **options) as client:
            yield client
    finally:
        await server.close()


@contextmanager
def on_a_thread(app: web.Application) -> Iterator[str]:
    """`app` on a real port, served by its own loop on its own thread, as a separate server
    process would be (for callers that block: schemathesis, a module-scoped fixture); its
    base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = listen(app, "127.0.0.1", 0, idle_timeout_s=15.0)
    runner = asyncio.run_coroutine_threadsafe(started, loop).result(timeout=30)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
