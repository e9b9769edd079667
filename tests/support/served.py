"""An LLM client on an aiohttp app served on a real port, as the services reach an endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.llm.client import LLMClient


@asynccontextmanager
async def client_on(app: web.Application) -> AsyncIterator[LLMClient]:
    server = TestServer(app)
    await server.start_server()
    try:
        async with LLMClient(f"http://127.0.0.1:{server.port}") as client:
            yield client
    finally:
        await server.close()
