"""tau2's user simulator through litellm at a fake OpenAI-compatible endpoint, and the runner
driving a tau2 episode with both sides faked (SmolLM2 plays them in tests/model)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from shared.envs.protocol import Message, advance, start
from shared.envs.runner import run_episode
from shared.envs.tau2.config import Tau2Config
from shared.envs.tau2.env import Tau2Environment
from shared.envs.tau2.user import STOP, UserSimulatorError
from shared.messages import Sampling
from tests.support.fake_chat import FakeJudge, Serve, script

pytestmark = pytest.mark.timeout(60)


def env_at(url: str, **extra: Any) -> Tau2Environment:
    return Tau2Environment("retail", Tau2Config(user_url=url, user_model="sim", **extra))


def task0(env: Tau2Environment) -> Any:
    return next(t for t in env.tasks() if t.id == "0")


async def test_simulator_opens_and_stops_the_conversation(serve: Serve) -> None:
    user = FakeJudge(script("I want to exchange a keyboard.", "Thanks! " + STOP))
    client = await serve(user)
    env = env_at(client.base_url)
    episode = await start(env, task0(env), seed=5)
    assert [m.content for m in episode.messages] == [
        "Hi! How can I help you today?",
        "I want to exchange a keyboard.",
    ]
    [opening] = user.requests
    assert opening["model"] == "sim" and opening["temperature"] == 0.0 and opening["seed"] == 5
    system, greeting = opening["messages"]
    assert system["role"] == "system" and "Yusuf Rossi" in system["content"]
    assert "<scenario>" in system["content"]  # tau2's user-simulator prompt
    assert greeting == {"role": "user", "content": "Hi! How can I help you today?"}

    result = await advance(episode, Message(role="assistant", content="Your name and zip?"))
    assert result.done and result.messages == [Message(role="user", content="Thanks! " + STOP)]
    assert episode.termination.value == "user_stop"
    # The simulator saw the whole conversation with roles flipped.
    assert [m["role"] for m in user.requests[1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]


async def test_unreachable_simulator_is_a_retryable_error() -> None:
    env = env_at("http://127.0.0.1:9/v1", user_attempts=2, user_timeout=5)
    with pytest.raises(UserSimulatorError, match="failed 2 times"):
        await start(env, task0(env), seed=0)


async def test_runner_plays_a_tau2_episode(serve: Serve) -> None:
    user = FakeJudge(script("I want to exchange a keyboard.", STOP))
    agent = FakeJudge(script("Sorry, I cannot help with exchanges."))
    env = env_at((await serve(user)).base_url)
    result = await run_episode(
        await serve(agent), "agent", env, task0(env), seed=0, sampling=Sampling(temperature=0)
    )
    assert result.error is None and result.turns == 1
    assert [m["role"] for m in result.messages] == [
        "system",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert "<policy>" in result.messages[0]["content"]
    assert agent.requests[0]["tools"]  # tau2's tools went to the agent
    assert result.score.reward == 0.0 and result.score.breakdown == {"db": 0.0, "communicate": 1.0}


async def test_runner_marks_a_failing_simulator_as_an_endpoint_error(serve: Serve) -> None:
    def flaky(body: dict[str, Any]) -> str:
        if len(body["messages"]) > 2:
            raise RuntimeError("simulator down")  # the fake answers 500
        return "I want to exchange a keyboard."

    agent = FakeJudge(script("Which order?"))
    env = env_at((await serve(FakeJudge(flaky))).base_url, user_attempts=2)
    result = await run_episode(await serve(agent), "agent", env, task0(env), seed=0)
    assert result.model_error and result.error is not None and "failed 2 times" in result.error
