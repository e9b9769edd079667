"""The router's OpenAPI document (`/openapi.json`, docs/openapi-router.json), from the Structs
its routes decode and encode."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from services.router.handlers import Feedback
from shared.llm.openai_types import ChatRequest, ChatResponse, ErrorResponse, ModelList
from shared.openapi import Route, document
from shared.runtime.http import Health


class FeedbackRecorded(msgspec.Struct, kw_only=True, frozen=True):
    conversation_id: uuid.UUID
    recorded: bool


ROUTES = (
    Route("post", "/v1/chat/completions", "Chat with an agent (`model` is the agent's name); "
          "the router picks its adapter, or the base model, per conversation. The answer "
          "carries X-Retrace-Conversation and X-Retrace-Adapter headers; send "
          "X-Retrace-Conversation back to continue that conversation (400 for an id that is "
          "not a UUID; one the router does not know opens a new conversation).", ChatRequest,
          ChatResponse),
    Route("post", "/v1/feedback", "Reward or success for a conversation (by its "
          "X-Retrace-Conversation id)", Feedback, FeedbackRecorded),
    Route("get", "/v1/models", "The tenant's agents", response=ModelList),
    Route("get", "/healthz", "Health of the service and its connections", response=Health,
          secured=False),
    Route("get", "/metrics", "Prometheus metrics (needs RETRACE_HTTP_METRICS_KEY when set)",
          media="text/plain"),
)  # fmt: skip


def router_openapi() -> dict[str, Any]:
    return document(
        "retrace router",
        "1",
        "The tenant-facing, OpenAI-compatible gateway. Every /v1 route needs the tenant's API "
        "key as a bearer token; errors have OpenAI's shape.",
        ROUTES,
        ErrorResponse,
    )
