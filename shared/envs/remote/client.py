"""An environment in another process or language, reached over the HTTP environment protocol
(shared/envs/remote/wire.py). retrace names it by its base URL: `--env http://host:8600`.

Failures are sorted the way the rest of retrace needs them:
- unreachable, timed out, or a 5xx/429 answer: retried under `ENV_HTTP_RETRY`, then a
  `RetryableError`. A rollout then retries the episode later; nothing is stored as the agent's
  failure.
- a 4xx answer, or a 2xx whose body is not what the protocol says: an `EnvironmentProtocolError`
  (permanent) quoting the body. The episode it happens in is stored ungraded (`env_error`).
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import urllib.parse
from typing import Any, TypeVar

import aiohttp
import msgspec

from shared.envs.protocol import Message, Score, StepResult, TaskSpec
from shared.envs.remote.address import GuardedResolver, check_resolved, checked_url
from shared.envs.remote.wire import (
    PREFIX,
    ResetRequest,
    ResetResponse,
    ScoreRequest,
    ScoreResponse,
    StepRequest,
    StepResponse,
    TaskList,
)
from shared.errors import UNDECODABLE, PermanentError, RetryableError
from shared.retry import RetryPolicy, with_retry

T = TypeVar("T")
ENV_HTTP_RETRY = RetryPolicy(
    "environment-http",
    attempts=4,
    base_delay=0.5,
    max_delay=8.0,
    timeout=60.0,
    retry_on=(OSError, TimeoutError, aiohttp.ClientError, RetryableError),
)
"""Each call: 60 s, four attempts, backoff up to 8 s."""
TASKS_TIMEOUT_S = 30.0
QUOTE = 500
"""Characters of a bad body quoted in an error."""


def _get(url: str, timeout: float) -> tuple[int, str]:
    """GET `url`: its status and body. The host is resolved once and checked
    (`check_resolved`), and the connection made to that address, so the name cannot point
    elsewhere between the check and the connection (urllib resolved it again: a name with
    no TTL could answer a public address to the check and an inner one to the connection).
    A redirect is the answer, not a place to go (it could lead anywhere)."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    host = parts.hostname or ""
    address = check_resolved(host, port)
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = kind(host, port, timeout=timeout)  # the name for Host and TLS, the address for TCP
    conn._create_connection = functools.partial(_connect_to, address)  # type: ignore[attr-defined]
    try:
        conn.request("GET", parts.path or "/", headers={"Accept": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _connect_to(address: str, named: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
    """`socket.create_connection` to `address` instead of the name `http.client` has."""
    return socket.create_connection((address, named[1]), *args, **kwargs)


class EnvironmentProtocolError(PermanentError):
    """The environment answered, but not as the protocol says (the body is quoted)."""


def is_http_ref(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


class HttpEnvironment:
    """The protocol's client side; tasks are fetched once, when it is built."""

    def __init__(self, url: str, *, policy: RetryPolicy = ENV_HTTP_RETRY) -> None:
        self.name = checked_url(url)
        self.base = url.rstrip("/") + PREFIX
        self.policy = policy
        self._tasks = [
            TaskSpec(id=t.id, kind=t.kind, split=t.split, data=t.data)
            for t in self._fetch_tasks().tasks
        ]

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> HttpEpisode:
        raise PermanentError(
            f"environment {self.name} is reached over HTTP: start its episodes with "
            "shared.envs.protocol.start (areset)"
        )

    async def areset(self, task: TaskSpec, seed: int) -> HttpEpisode:
        opened = await self.call("/reset", ResetRequest(task_id=task.id, seed=seed), ResetResponse)
        return HttpEpisode(self, opened)

    async def call(self, path: str, body: msgspec.Struct, answer: type[T]) -> T:
        url = self.base + path
        payload = msgspec.json.encode(body)

        async def once() -> T:
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(resolver=GuardedResolver())
                ) as session,
                session.post(
                    url,
                    data=payload,
                    headers={"Content-Type": "application/json"},
                    allow_redirects=False,  # a redirect could lead anywhere: it is an answer
                ) as response,
            ):
                text = await response.text(errors="replace")
                return _decoded(url, response.status, text, answer)

        try:
            return await with_retry(self.policy, once)
        except (OSError, TimeoutError, aiohttp.ClientError, RetryableError) as exc:
            raise RetryableError(
                f"environment {self.name} unreachable or failing: {exc!r}"
            ) from exc

    def _fetch_tasks(self) -> TaskList:
        url = self.base + "/tasks"
        try:
            status, text = _get(url, TASKS_TIMEOUT_S)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise RetryableError(f"environment {self.name}: cannot list its tasks: {exc}") from exc
        listing = _decoded(url, status, text, TaskList)
        if not listing.tasks:
            raise EnvironmentProtocolError(f"environment {self.name} lists no tasks")
        return listing


class HttpEpisode:
    def __init__(self, env: HttpEnvironment, opened: ResetResponse) -> None:
        self.env = env
        self.episode_id = opened.episode_id
        self.system_prompt = opened.system_prompt
        self.tools = opened.tools
        self.messages = opened.messages
        self.turn = 0

    async def astep(self, assistant: Message) -> StepResult:
        answer = await self.env.call(
            "/step",
            StepRequest(episode_id=self.episode_id, turn=self.turn, message=assistant),
            StepResponse,
        )
        self.turn += 1
        return StepResult(messages=answer.messages, done=answer.done)

    async def ascore(self) -> Score:
        graded = await self.env.call(
            "/score", ScoreRequest(episode_id=self.episode_id), ScoreResponse
        )
        if not 0.0 <= graded.reward <= 1.0:
            raise EnvironmentProtocolError(
                f"environment {self.env.name} scored an episode {graded.reward}, outside [0, 1]"
            )
        return Score(
            reward=graded.reward,
            success=graded.success,
            breakdown=graded.breakdown,
            notes=graded.notes,
        )

    def step(self, assistant: Message) -> StepResult:
        raise PermanentError("an HTTP episode is stepped with astep")

    def score(self) -> Score:
        raise PermanentError("an HTTP episode is scored with ascore")


def _decoded(url: str, status: int, text: str, answer: type[T]) -> T:
    if status == 429 or status >= 500:
        raise RetryableError(f"{url} answered {status}: {_quote(text)}")
    if status >= 400:
        raise EnvironmentProtocolError(f"{url} refused the request ({status}): {_quote(text)}")
    try:
        return msgspec.json.decode(text, type=answer)
    except UNDECODABLE as exc:
        raise EnvironmentProtocolError(
            f"{url} answered {status} with a body that is not a {answer.__name__} ({exc}): "
            f"{_quote(text)}"
        ) from None


def _quote(text: str) -> str:
    try:
        message = json.loads(text)["error"]["message"]
        if isinstance(message, str):
            return repr(message[:QUOTE])
    except (ValueError, KeyError, TypeError, RecursionError):
        pass
    return repr(text[:QUOTE] + ("..." if len(text) > QUOTE else ""))


__all__ = [
    "ENV_HTTP_RETRY",
    "EnvironmentProtocolError",
    "HttpEnvironment",
    "HttpEpisode",
    "is_http_ref",
]
