"""Wiring of the train service."""

from __future__ import annotations

import msgspec

from services.train.config import DEFAULT_PORT, TrainConfig
from services.train.handlers import TrainHandlers
from shared.llm.client import LLMClient
from shared.runtime.service import Service

NAME = "train"


def build(cfg: TrainConfig) -> Service:
    if cfg.max_jobs is not None and cfg.max_jobs < cfg.consumer.concurrency:
        # a job is one message in flight: fetch no more than the worker may train at once
        consumer = msgspec.structs.replace(cfg.consumer, concurrency=cfg.max_jobs)
        cfg = msgspec.structs.replace(cfg, consumer=consumer)
    # the endpoint: adapters are loaded into it, and prompt optimisation runs episodes on it
    client = LLMClient.for_endpoint(cfg.model)

    async def close(_: Service) -> None:
        await client.close()

    handlers = TrainHandlers(cfg, client)
    return Service(NAME, cfg, handlers.table(), default_port=DEFAULT_PORT, on_stop=close)
