"""The HTTP environment protocol end to end: the reference server (`retrace env serve`) in front
of the hotel desk, the client retrace runs episodes through, and the rollout service storing a
rollout over it; a dead environment is a retryable error and a garbage answer a permanent one
that quotes the body."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from retrace_hotel_desk.env import HotelDesk
from sqlalchemy import select

from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.envs.protocol import Message, advance, grade, start
from shared.envs.reference import reference_of
from shared.envs.remote.client import ENV_HTTP_RETRY, EnvironmentProtocolError, HttpEnvironment
from shared.envs.remote.server import environment_app
from shared.envs.remote.wire import ResetRequest, ResetResponse, StepRequest, StepResponse
from shared.envs.runner import run_episode
from shared.errors import RetryableError
from shared.retry import RetryPolicy
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_rollout_service import completed, requested, rollout_cfg
from tests.integration.test_rollout_service import start as start_service
from tests.support.fake_chat import FakeJudge, script, serving
from tests.support.oracle_llm import OracleLLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
DESK = HotelDesk()
FAST = RetryPolicy(
    "test", attempts=2, base_delay=0.01, max_delay=0.02, timeout=5.0,
    retry_on=(OSError, TimeoutError, RetryableError),
)  # fmt: skip


@pytest.fixture
async def served() -> AsyncIterator[str]:
    server = TestServer(environment_app(DESK))
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


async def remote(url: str) -> HttpEnvironment:
    # the task list is fetched synchronously: off the loop the test server runs on
    return await asyncio.to_thread(HttpEnvironment, url, policy=FAST)


async def test_references_played_over_http_score_as_they_do_in_process(served: str) -> None:
    env = await remote(served)
    assert [t.id for t in env.tasks()] == [t.id for t in DESK.tasks()]
    for task in [t for t in env.tasks() if t.split == "train"][::6]:
        episode = await start(env, task, 0)
        assert episode.tools == DESK.reset(task, 0).tools
        for message in reference_of(task) or []:
            if (await advance(episode, message)).done:
                break
        assert (await grade(episode)).success, task.id


async def test_the_task_list_is_fetched_where_the_name_was_checked_to_lead(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 14: the task list's host was checked, then resolved again by urllib
    to connect, so a name with no TTL could lead the check to one address and the
    connection to another (DNS rebinding). It is resolved once now, and the connection made
    to the address checked: here the second answer would lead nowhere."""
    port = int(served.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1", "10.255.255.1", "10.255.255.1"])
    asked: list[str] = []
    real = socket.getaddrinfo

    def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        if host != "desk.rebinding.test":
            return real(host, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    env = await asyncio.to_thread(HttpEnvironment, f"http://desk.rebinding.test:{port}")
    assert [t.id for t in env.tasks()] == [t.id for t in DESK.tasks()]
    assert asked == ["desk.rebinding.test"]


async def test_a_step_sent_twice_is_applied_once(served: str) -> None:
    env = await remote(served)
    task = next(t for t in env.tasks() if t.kind == "book")
    episode = await env.areset(task, 0)
    booking = (reference_of(task) or [])[1]  # search, then book
    first = await env.call(
        "/step", StepRequest(episode_id=episode.episode_id, turn=0, message=booking), StepResponse
    )
    again = await env.call(
        "/step", StepRequest(episode_id=episode.episode_id, turn=0, message=booking), StepResponse
    )
    assert first == again
    with pytest.raises(EnvironmentProtocolError, match="turn 5 sent before turn 1"):
        await env.call(
            "/step",
            StepRequest(episode_id=episode.episode_id, turn=5, message=booking),
            StepResponse,
        )


async def test_a_dead_environment_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RetryableError, match="cannot list its tasks"):
        await remote(f"http://127.0.0.1:{port}")

    server = TestServer(environment_app(DESK))
    await server.start_server()
    env = await remote(f"http://127.0.0.1:{server.port}")
    episode = await env.areset(env.tasks()[0], 0)
    await server.close()
    with pytest.raises(RetryableError, match="unreachable or failing"):
        await advance(episode, Message(role="assistant", content="hello"))


async def _garbage_server(status: int, body: str) -> TestServer:
    async def answer(request: web.Request) -> web.Response:
        if request.path.endswith("/tasks"):
            return web.json_response(
                {
                    "name": "g",
                    "tasks": [{"id": "a", "split": "train"}, {"id": "b", "split": "test"}],
                }
            )
        if request.path.endswith("/reset"):
            return web.json_response(
                {"episode_id": "e", "system_prompt": "", "tools": [], "messages": []}
            )
        return web.Response(status=status, text=body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = TestServer(app)
    await server.start_server()
    return server


@pytest.mark.parametrize(
    ("status", "body", "error", "quoted"),
    [
        (200, "<html>maintenance page</html>", EnvironmentProtocolError, "maintenance page"),
        (200, '{"messages": "not a list", "done": false}', EnvironmentProtocolError, "not a list"),
        (422, '{"error": {"message": "turn must be an int"}}', EnvironmentProtocolError, "must be"),
        (503, "overloaded", RetryableError, "overloaded"),
    ],
)  # fmt: skip
async def test_a_bad_answer_is_an_error_that_quotes_it(
    status: int, body: str, error: type[Exception], quoted: str
) -> None:
    server = await _garbage_server(status, body)
    try:
        env = await remote(f"http://127.0.0.1:{server.port}")
        episode = await env.areset(env.tasks()[0], 0)
        with pytest.raises(error, match=quoted):
            await advance(episode, Message(role="assistant", content="hello"))
        if error is EnvironmentProtocolError:  # in an episode: stored ungraded, not the agent's
            async for serve in serving():
                client = await serve(FakeJudge(script("hi")))
                result = await run_episode(client, "m", env, env.tasks()[0], 0)
                assert result.env_error and quoted in (result.error or "")
    finally:
        await server.close()


async def test_a_redirect_is_an_answer_not_a_place_to_go() -> None:
    """An environment server could redirect the services anywhere inside the deployment (a
    literal address is never resolved, so the resolver's guard would not see it), and the
    answer there was quoted back in the episode's error: redirects are not followed."""
    followed: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/inside":
            followed.append(request.path)
            return web.Response(text="the deployment's secret")
        # a GET (the task list) is sent on with a 302, a POST (every other call) with a 307
        raise (
            web.HTTPFound(f"http://127.0.0.1:{server.port}/inside")
            if request.method == "GET"
            else web.HTTPTemporaryRedirect(f"http://127.0.0.1:{server.port}/inside")
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = TestServer(app)
    await server.start_server()
    try:
        with pytest.raises(EnvironmentProtocolError) as refused:
            await remote(f"http://127.0.0.1:{server.port}")
        assert "secret" not in str(refused.value)
        env = HttpEnvironment.__new__(HttpEnvironment)  # past the task list, to each call
        env.name, env.base, env.policy = "e", f"http://127.0.0.1:{server.port}/v1", ENV_HTTP_RETRY
        with pytest.raises(EnvironmentProtocolError) as refused:
            await env.call("/reset", ResetRequest(task_id="a", seed=0), ResetResponse)
        assert "secret" not in str(refused.value)
        assert followed == []
    finally:
        await server.close()


async def test_the_rollout_service_runs_an_http_environment(
    service_cfg: ServiceConfig, store: Store, served: str
) -> None:
    oracle = TestServer(OracleLLM(DESK).app())
    await oracle.start_server()
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "desk", model="oracle", environment=served)
    service, run = await start_service(
        rollout_cfg(service_cfg, f"http://127.0.0.1:{oracle.port}/v1")
    )
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    chosen = [t.id for t in DESK.tasks() if t.split == "train"][::9]
    request_id = await requested(bus, agent.id, served, within=60, task_ids=chosen)
    [event] = await completed(bus, request_id)
    assert (event.trajectories, event.successes, event.env_errors) == (len(chosen), len(chosen), 0)
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
        )
    assert len(rows) == len(chosen) and all(r.success for r in rows)
    # the environment's opening is marked: the agent's own turns start right after it
    for row in rows:
        opening = row.reward_breakdown["opening"]
        assert [m["role"] for m in row.messages[:opening]] == ["system", "user"]
        assert row.messages[opening]["role"] == "assistant"
    service.stop()
    assert await run == 0
    await bus.close()
    await oracle.close()


async def test_an_environment_failing_behind_the_server_is_stored_ungraded_not_retried() -> None:
    """`retrace env serve` answers an exception from the environment with 422: the same step
    would fail again (or apply twice), so the episode ends ungraded instead of being retried."""

    class BrokenDesk(HotelDesk):
        def user_reply(self, task, state, turn):  # type: ignore[no-untyped-def]
            raise KeyError("the user simulator lost its script")

    server = TestServer(environment_app(BrokenDesk()))
    await server.start_server()
    try:
        env = await remote(f"http://127.0.0.1:{server.port}")
        async for serve in serving():
            client = await serve(FakeJudge(script("Anything else?")))
            result = await run_episode(client, "m", env, env.tasks()[0], 0)
            assert result.env_error and not result.model_error
            assert "environment_error" in (result.error or "") or "lost its script" in (
                result.error or ""
            )
    finally:
        await server.close()
