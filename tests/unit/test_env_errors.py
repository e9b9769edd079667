"""An environment that fails is not an agent that fails: the runner ends such an episode
ungraded (`env_error`), whether the reset, a step or the scoring raised."""

from __future__ import annotations

import random
from typing import Any

import pytest
from retrace_hotel_desk.env import HotelDesk
from retrace_hotel_desk.hotel import Hotel

from shared.envs.kit import Score, TaskSpec, Transcript
from shared.envs.runner import run_episode
from tests.support.fake_chat import FakeJudge, Serve, script


class _Broken(HotelDesk):
    def __init__(self, where: str) -> None:
        self.where = where

    def initial_state(self, task: TaskSpec, rng: random.Random) -> Hotel:
        if self.where == "reset":
            raise RuntimeError("the world file is missing")
        return super().initial_state(task, rng)

    def user_reply(self, task: TaskSpec, state: Hotel, turn: int) -> str | None:
        if self.where == "step":
            raise KeyError("user simulator state")
        return super().user_reply(task, state, turn)

    def reward(self, task: TaskSpec, transcript: Transcript[Hotel]) -> Score:
        if self.where == "score":
            raise ZeroDivisionError("no checks")
        return super().reward(task, transcript)


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("reset", "environment reset failed: RuntimeError"),
        ("step", "environment failed on turn 1: KeyError"),
        ("score", "environment scoring failed: ZeroDivisionError"),
    ],
)
async def test_an_environment_failure_ends_the_episode_ungraded(
    serve: Serve, where: str, reason: str
) -> None:
    client = await serve(FakeJudge(script("I cannot help with that.")))
    env = _Broken(where)
    task = env.tasks()[0]
    result = await run_episode(client, "m", env, task, 0)
    assert result.env_error and not result.model_error
    assert result.error is not None and result.error.startswith(reason)
    assert result.score.reward == 0.0 and not result.score.success


async def test_a_working_environment_grades_the_agent(serve: Serve) -> None:
    client = await serve(FakeJudge(script("I cannot help with that.")))
    env = _Broken("nowhere")
    result: Any = await run_episode(client, "m", env, env.tasks()[0], 0)
    assert not result.env_error and result.error is None
    assert result.score.breakdown == {"booked_what_was_asked": 0.0}
