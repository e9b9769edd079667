"""Making sure the inference endpoint serves a model or adapter before using it.

Adapters are loaded into the endpoint when they are trained, but an endpoint that restarts
(or a second replica) has forgotten them. A caller about to use an adapter asks here: if
the endpoint does not list it and the tenant has an adapter of that name in the store, it
is loaded from its artifact path (`/v1/load_lora_adapter`), the same way the train service
loads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.errors import PermanentError
from shared.llm.client import LLMClient, LLMError, LLMRequestError
from shared.logging import get_logger
from shared.store.models import Adapter

log = get_logger(__name__)

LOAD_WAIT_S = 60.0
"""How long a request waits for another's load of the adapter it needs to land."""


class Served:
    """The endpoint's model list, cached for `ttl_s` (a load refreshes it)."""

    def __init__(self, client: LLMClient, ttl_s: float = 10.0) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._names: list[str] = []
        self._at = float("-inf")

    async def names(self, fresh: bool = False) -> list[str]:
        if fresh or time.monotonic() - self._at > self.ttl_s:
            self._names = await self.client.models()
            self._at = time.monotonic()
        return self._names

    async def wait_until_up(self, within_s: float, on_wait: Callable[[], Awaitable[None]]) -> None:
        """Return once the endpoint answers `/v1/models`; while it refuses connections or
        answers 5xx (a server still loading its model, a restart), wait and ask again, calling
        `on_wait` (a heartbeat) each time. After `within_s` the last error is raised: a
        dependency that is not up yet is waited for, not counted as a failed attempt."""
        deadline = time.monotonic() + within_s
        pause = 1.0
        while True:
            try:
                await self.names(fresh=True)
                return
            except (LLMError, aiohttp.ClientConnectionError, TimeoutError) as exc:
                if time.monotonic() + pause > deadline:
                    raise
                log.info("inference endpoint not up yet; waiting", error=repr(exc), pause=pause)
            await on_wait()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 15.0)

    async def ensure(self, model: str, artifact_uri: str | None) -> None:
        """Return once the endpoint serves `model`; load it from `artifact_uri` (an adapter's,
        from `artifact_of`) when it does not; a `PermanentError` saying what is served
        otherwise. Called outside any transaction: it may wait on the endpoint."""
        if model in await self.names():
            return
        if model in await self.names(fresh=True):
            return
        if artifact_uri:
            log.info("adapter not served; loading it", adapter=model, path=artifact_uri)
            try:
                await self.client.load_adapter(model, artifact_uri)
            except LLMRequestError as exc:
                # another request (or router process) is loading it: the endpoint
                # (serve-model, vLLM) refuses a name it holds with a 400; it is served once
                # that load ends
                if "already" not in str(exc).lower():
                    raise
                await self._until_served(model)
            if model in await self.names(fresh=True):
                return
        raise PermanentError(
            f"the inference endpoint serves {await self.names()}, not {model!r}: "
            "load the adapter or fix the agent's model"
        )

    async def _until_served(self, model: str, within_s: float = LOAD_WAIT_S) -> None:
        """Wait (for `within_s` at most) until the endpoint lists `model`."""
        deadline = time.monotonic() + within_s
        pause = 0.1
        while model not in await self.names(fresh=True) and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)


async def artifact_of(session: AsyncSession, model: str) -> str | None:
    """The artifact of the tenant's adapter named `model` (None for a base model)."""
    adapter = await session.scalar(select(Adapter).where(Adapter.name == model))
    return adapter.artifact_uri if adapter is not None else None
