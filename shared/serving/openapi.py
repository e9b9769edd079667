"""The model server's OpenAPI document (`retrace serve-model`, `/openapi.json`,
docs/openapi-model-server.json), from the Structs its routes decode and encode."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.llm.openai_types import (
    ChatRequest,
    ChatResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    LoadAdapterRequest,
    ModelList,
    UnloadAdapterRequest,
)
from shared.openapi import Route, document


class ServerHealth(msgspec.Struct, kw_only=True, frozen=True):
    """GET /healthz and /health."""

    status: str
    model: str
    adapters: int
    """How many adapters are loaded (their names only to a caller with the key:
    `/v1/models`)."""


ROUTES = (
    Route("post", "/v1/chat/completions", "Chat, with tools (OpenAI's API; `stream` gives "
          "server-sent events)", ChatRequest, ChatResponse),
    Route("post", "/v1/completions", "Text completion (OpenAI's API)", CompletionRequest,
          CompletionResponse),
    Route("get", "/v1/models", "The base model and the loaded adapters", response=ModelList),
    Route("post", "/v1/load_lora_adapter", "Load a LoRA adapter from the artifact store "
          "(vLLM's API; a path outside it is a 403); answers a line of text. Needs the admin "
          "key where one is set", LoadAdapterRequest, media="text/plain"),
    Route("post", "/v1/unload_lora_adapter", "Unload an adapter (vLLM's API); answers a line "
          "of text. Needs the admin key where one is set", UnloadAdapterRequest,
          media="text/plain"),
    Route("get", "/healthz", "Liveness", response=ServerHealth, secured=False),
    Route("get", "/health", "Liveness, at vLLM's path", response=ServerHealth, secured=False),
    Route("get", "/metrics", "Prometheus metrics", media="text/plain"),
)  # fmt: skip


def model_server_openapi() -> dict[str, Any]:
    return document(
        "retrace model server",
        "1",
        "An OpenAI-compatible endpoint for a base model and its LoRA adapters. Every route but "
        "health needs the server's key as a bearer token (RETRACE_MODEL_API_KEY); loading and "
        "unloading adapters the admin key instead where one is set (RETRACE_MODEL_ADMIN_KEY).",
        ROUTES,
        ErrorResponse,
    )
