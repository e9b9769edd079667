"""Wiring of the rollout service."""

from __future__ import annotations

from services.rollout.config import DEFAULT_PORT, RolloutConfig
from services.rollout.handlers import RolloutHandlers
from shared.llm.client import CHAT_RETRY, LLMClient
from shared.retry import RetryPolicy
from shared.runtime.service import Service

NAME = "rollout"


def build(cfg: RolloutConfig) -> Service:
    policy = RetryPolicy(
        CHAT_RETRY.name,
        CHAT_RETRY.attempts,
        CHAT_RETRY.base_delay,
        CHAT_RETRY.max_delay,
        cfg.model.request_timeout,
        CHAT_RETRY.retry_on,
    )
    client = LLMClient(cfg.model.url, api_key=cfg.model.api_key, chat_retry=policy)

    async def close(_: Service) -> None:
        await client.close()

    return Service(
        NAME, cfg, RolloutHandlers(cfg, client).table(), default_port=DEFAULT_PORT, on_stop=close
    )
