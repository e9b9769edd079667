"""Hinted rollouts through the runner the rollout service uses (calibration hints the first
trials of each task): the episode's hint joins the system turn inside `<expert_guidance>`
only when asked, and an environment without hints is never changed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from shared.envs.guidance import CLOSE, OPEN, hinted_trials
from shared.envs.registry import get_environment
from shared.envs.runner import run_episode
from shared.envs.synthetic import SyntheticEnvironment, family_spec
from shared.llm.client import LLMClient
from shared.messages import Sampling
from tests.support.oracle_llm import OracleLLM

ENV = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))


@pytest.fixture
async def oracle() -> AsyncIterator[LLMClient]:
    server = TestServer(OracleLLM(ENV).app())
    await server.start_server()
    async with LLMClient(f"http://127.0.0.1:{server.port}/v1") as client:
        yield client
    await server.close()


async def test_only_hinted_episodes_see_the_hint(oracle: LLMClient) -> None:
    task = next(t for t in ENV.tasks() if t.split == "train")
    seed = int(task.data["seed"])
    greedy = Sampling(temperature=0)
    hinted = await run_episode(oracle, "m", ENV, task, seed, sampling=greedy, hinted=True)
    plain = await run_episode(oracle, "m", ENV, task, seed, sampling=greedy)
    hint = ENV.reset(task, seed).hint
    assert f"{OPEN}\n{hint}\n{CLOSE}" in hinted.messages[0]["content"]
    assert OPEN not in plain.messages[0]["content"]
    assert hinted.messages[0]["content"].startswith(plain.messages[0]["content"])
    assert hinted.score.reward == plain.score.reward == 1.0  # the oracle plays the reference


async def test_a_target_without_hints_is_unchanged_when_hinted() -> None:
    toolbox = get_environment("toolbox")
    task = next(t for t in toolbox.tasks() if t.split == "train")
    server = TestServer(OracleLLM(toolbox).app())
    await server.start_server()
    try:
        async with LLMClient(f"http://127.0.0.1:{server.port}/v1") as client:
            hinted = await run_episode(client, "m", toolbox, task, 0, hinted=True)
            plain = await run_episode(client, "m", toolbox, task, 0)
    finally:
        await server.close()
    assert hinted.messages[0] == plain.messages[0]
    assert hinted_trials(4, 0.25) == frozenset({0}) and hinted_trials(4, 0.0) == frozenset()
