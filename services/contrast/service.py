"""Wiring of the contrast service."""

from __future__ import annotations

from services.contrast.config import DEFAULT_PORT, ContrastConfig
from services.contrast.handlers import ContrastHandlers
from shared.llm.client import LLMClient
from shared.runtime.service import Service

NAME = "contrast"


def build(cfg: ContrastConfig) -> Service:
    client = LLMClient.for_endpoint(cfg.model) if cfg.judge_model else None

    async def close(_: Service) -> None:
        if client is not None:
            await client.close()

    handlers = ContrastHandlers(cfg, client)
    return Service(NAME, cfg, handlers.table(), default_port=DEFAULT_PORT, on_stop=close)
