"""The HTTP environment protocol, version 1: the bodies its four routes exchange.

    GET  /v1/tasks                              -> {name, tasks: [{id, split, kind, data}]}
    POST /v1/reset {task_id, seed}              -> {episode_id, system_prompt, tools, messages}
    POST /v1/step  {episode_id, turn, message}  -> {messages, done}
    POST /v1/score {episode_id}                 -> {reward, success, breakdown, notes}

`turn` counts the episode's steps from 0 and makes a step idempotent: a step sent again with a
turn already taken (a client retrying after a lost answer) gets the answer it had, and is not
applied twice. Errors are `{"error": {"message", "type"}}`: 4xx when retrying cannot help (a
wrong request, or `environment_error`, the environment failing on this one), 5xx or 429 when
the environment is unavailable for now (the client retries).
docs/environment-http.json is the OpenAPI document, generated from these Structs
(`python -m tests.support.openapi_docs`).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from shared.envs.protocol import Message, Split
from shared.openapi import Route, document

VERSION = 1
PREFIX = f"/v{VERSION}"


class WireTask(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    split: Split
    kind: str = "task"
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class TaskList(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    """The environment's own name (for logs; retrace names it by its URL)."""
    tasks: list[WireTask]


class ResetRequest(msgspec.Struct, kw_only=True, frozen=True):
    task_id: str
    seed: int = 0


class ResetResponse(msgspec.Struct, kw_only=True, frozen=True):
    episode_id: str
    system_prompt: str
    tools: list[dict[str, Any]]
    """OpenAI tool schemas."""
    messages: list[Message]
    """The opening messages (usually the user's request)."""


class StepRequest(msgspec.Struct, kw_only=True, frozen=True):
    episode_id: str
    turn: Annotated[int, msgspec.Meta(ge=0)]
    """0 for the episode's first step, then 1, 2, ..."""
    message: Message
    """The assistant's message."""


class StepResponse(msgspec.Struct, kw_only=True, frozen=True):
    messages: list[Message]
    done: bool


class ScoreRequest(msgspec.Struct, kw_only=True, frozen=True):
    episode_id: str


class ScoreResponse(msgspec.Struct, kw_only=True, frozen=True):
    reward: float
    """In [0, 1]."""
    success: bool
    breakdown: dict[str, float] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)


class ErrorBody(msgspec.Struct, kw_only=True, frozen=True):
    message: str
    type: str


class ErrorResponse(msgspec.Struct, kw_only=True, frozen=True):
    error: ErrorBody


ROUTES = (
    Route("get", PREFIX + "/tasks", "Every task with its split.", response=TaskList, secured=False),
    Route("post", PREFIX + "/reset", "Start a seeded, deterministic episode.", ResetRequest,
          ResetResponse, secured=False),
    Route("post", PREFIX + "/step", "Answer one assistant message (idempotent per turn).",
          StepRequest, StepResponse, secured=False),
    Route("post", PREFIX + "/score", "Grade the episode as it stands.", ScoreRequest,
          ScoreResponse, secured=False),
)  # fmt: skip


def openapi() -> dict[str, Any]:
    """The protocol's OpenAPI 3.1 document."""
    return document(
        "retrace environment protocol", str(VERSION), (__doc__ or "").strip(), ROUTES, ErrorResponse
    )
