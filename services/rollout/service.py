"""Wiring of the rollout service."""

from __future__ import annotations

from services.rollout.config import DEFAULT_PORT, RolloutConfig
from services.rollout.handlers import RolloutHandlers
from shared.llm.client import LLMClient
from shared.runtime.service import Service

NAME = "rollout"


def build(cfg: RolloutConfig) -> Service:
    client = LLMClient.for_endpoint(cfg.model)

    async def close(_: Service) -> None:
        await client.close()

    return Service(
        NAME, cfg, RolloutHandlers(cfg, client).table(), default_port=DEFAULT_PORT, on_stop=close
    )
