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
    """ok | engine stopped"""
    model: str
    adapters: int
    """How many adapters are loaded (their names only to a caller with the key:
    `/v1/models`)."""


class GateHealth(msgspec.Struct, kw_only=True, frozen=True):
    """GET /healthz and /health of `retrace model-gate`."""

    status: str
    """ok | unavailable (the engine behind the gate did not answer its health check)"""
    upstream: bool


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
    Route("get", "/metrics", "Prometheus metrics", media="text/plain"),
)  # fmt: skip
"""The routes `retrace serve-model` and `retrace model-gate` share."""
SERVER_HEALTH = (
    Route("get", "/healthz", "Whether the engine generates (503 when its thread stopped)",
          response=ServerHealth, secured=False),
    Route("get", "/health", "The same, at vLLM's path", response=ServerHealth, secured=False),
)  # fmt: skip
GATE_HEALTH = (
    Route("get", "/healthz", "Whether the engine behind the gate answers (503 when not)",
          response=GateHealth, secured=False),
    Route("get", "/health", "The same, at vLLM's path", response=GateHealth, secured=False),
)  # fmt: skip


def model_server_openapi() -> dict[str, Any]:
    return document(
        "retrace model server",
        "1",
        "An OpenAI-compatible endpoint for a base model and its LoRA adapters. Every route but "
        "health and this document needs the server's key as a bearer token "
        "(RETRACE_MODEL_API_KEY); loading and "
        "unloading adapters the admin key instead where one is set (RETRACE_MODEL_ADMIN_KEY).",
        ROUTES + SERVER_HEALTH,
        ErrorResponse,
    )


def model_gate_openapi() -> dict[str, Any]:
    return document(
        "retrace model gate",
        "1",
        "The model server's API and rules in front of an engine that cannot hold them (vLLM): "
        "every route but health and this document needs the server's key as a bearer token "
        "(RETRACE_MODEL_API_KEY); loading and unloading adapters the admin key instead where "
        "one is set (RETRACE_MODEL_ADMIN_KEY), and only from the artifact store. Replies are "
        "the engine's, passed through; an engine failure is a 502.",
        ROUTES + GATE_HEALTH,
        ErrorResponse,
    )
