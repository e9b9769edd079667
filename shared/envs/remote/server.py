"""Any environment served over the HTTP environment protocol (`retrace env serve <name>`): the
reference server, and the way to run an environment in a process of its own.

Episodes live in memory, the oldest dropped (and closed) past `max_episodes`; all are closed
when the server stops. An exception from the environment answers 422 `environment_error`: the
same request would fail again, so the client stores the episode ungraded rather than retry.
Each episode keeps the answers to its steps, so a step sent again for a turn already taken gets
the same answer (idempotent retries).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from shared.envs.protocol import Environment, Episode, advance, close, grade, start
from shared.envs.remote.wire import (
    PREFIX,
    ErrorBody,
    ErrorResponse,
    ResetRequest,
    ResetResponse,
    ScoreRequest,
    ScoreResponse,
    StepRequest,
    StepResponse,
    TaskList,
    WireTask,
)
from shared.errors import UNDECODABLE
from shared.logging import get_logger

log = get_logger(__name__)
MAX_BODY = 4 * 1024 * 1024


@dataclass
class _Live:
    episode: Episode
    answers: list[StepResponse] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _ProtocolError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def environment_app(env: Environment, *, max_episodes: int = 4096) -> web.Application:
    """An aiohttp application serving `env` under /v1."""
    tasks = {task.id: task for task in env.tasks()}
    listing = msgspec.json.encode(
        TaskList(
            name=env.name,
            tasks=[
                WireTask(id=t.id, split=t.split, kind=t.kind, data=t.data) for t in tasks.values()
            ],
        )
    )
    live: OrderedDict[str, _Live] = OrderedDict()

    def episode_of(episode_id: str) -> _Live:
        found = live.get(episode_id)
        if found is None:
            raise _ProtocolError(
                404,
                "unknown_episode",
                f"no episode {episode_id!r} (ended, or dropped as one of the oldest)",
            )
        return found

    async def list_tasks(_: web.Request) -> web.Response:
        return web.Response(body=listing, content_type="application/json")

    async def reset(request: web.Request) -> web.Response:
        body = await _decode(request, ResetRequest)
        task = tasks.get(body.task_id)
        if task is None:
            raise _ProtocolError(404, "unknown_task", f"no task {body.task_id!r}")
        episode = await start(env, task, body.seed)
        episode_id = uuid.uuid4().hex
        live[episode_id] = _Live(episode)
        while len(live) > max_episodes:
            _, dropped = live.popitem(last=False)
            await _release(dropped.episode)
        return _json(
            ResetResponse(
                episode_id=episode_id,
                system_prompt=episode.system_prompt,
                tools=episode.tools,
                messages=list(episode.messages),
            )
        )

    async def step(request: web.Request) -> web.Response:
        body = await _decode(request, StepRequest)
        if body.message.role != "assistant":
            raise _ProtocolError(400, "invalid_request", "a step takes an assistant message")
        state = episode_of(body.episode_id)
        async with state.lock:
            if body.turn < len(state.answers):
                return _json(state.answers[body.turn])  # a retry: the answer it had
            if body.turn > len(state.answers):
                raise _ProtocolError(
                    409,
                    "turn_out_of_order",
                    f"turn {body.turn} sent before turn {len(state.answers)}",
                )
            result = await advance(state.episode, body.message)
            state.answers.append(StepResponse(messages=list(result.messages), done=result.done))
            return _json(state.answers[-1])

    async def score(request: web.Request) -> web.Response:
        body = await _decode(request, ScoreRequest)
        graded = await grade(episode_of(body.episode_id).episode)
        return _json(
            ScoreResponse(
                reward=graded.reward,
                success=graded.success,
                breakdown=graded.breakdown,
                notes=graded.notes,
            )
        )

    async def close_all(_: web.Application) -> None:
        while live:
            await _release(live.popitem()[1].episode)

    app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors])
    app.on_cleanup.append(close_all)
    app.router.add_get(PREFIX + "/tasks", list_tasks)
    app.router.add_post(PREFIX + "/reset", reset)
    app.router.add_post(PREFIX + "/step", step)
    app.router.add_post(PREFIX + "/score", score)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure as the protocol's JSON error: 4xx for the request, 5xx for the environment."""
    try:
        return await handler(request)
    except _ProtocolError as exc:
        return _error(exc.status, exc.kind, exc.message)
    except web.HTTPException as exc:
        return _error(exc.status, "http_error", exc.reason)
    except Exception as exc:  # the environment's own code failed on this request
        # 422, not 5xx: running the same step again would fail the same way (or apply it
        # twice); the client stores the episode ungraded instead of retrying it
        log.exception("environment failed", path=request.path)
        return _error(422, "environment_error", f"{type(exc).__name__}: {exc}")


async def _decode(request: web.Request, kind: type[Any]) -> Any:
    raw = await request.read()
    try:
        return msgspec.json.decode(raw, type=kind)
    except UNDECODABLE as exc:
        raise _ProtocolError(400, "invalid_request", f"not a {kind.__name__}: {exc}") from None


async def _release(episode: Episode) -> None:
    try:
        await close(episode)
    except Exception:  # the environment's cleanup; the episode is gone either way
        log.exception("closing an episode failed")


def _json(body: msgspec.Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=msgspec.json.encode(ErrorResponse(error=ErrorBody(message=message, type=kind))),
        content_type="application/json",
    )
