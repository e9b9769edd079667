"""Wiring of the synthesize service."""

from __future__ import annotations

from services.synthesize.config import DEFAULT_PORT, SynthesizeConfig
from services.synthesize.handlers import SynthesizeHandlers
from shared.llm.client import LLMClient
from shared.runtime.service import Service

NAME = "synthesize"


def build(cfg: SynthesizeConfig) -> Service:
    client = LLMClient.for_endpoint(cfg.model) if cfg.writer_model else None

    async def close(_: Service) -> None:
        if client is not None:
            await client.close()

    handlers = SynthesizeHandlers(cfg, client)
    return Service(NAME, cfg, handlers.table(), default_port=DEFAULT_PORT, on_stop=close)
