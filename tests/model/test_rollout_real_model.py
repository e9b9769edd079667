"""The real counterpart of the oracle fake: SmolLM2 behind `serve-model` plays toolbox and
helpdesk episodes through the same runner the rollout service uses."""

from __future__ import annotations

import pytest

from shared.envs.registry import get_environment
from shared.envs.runner import run_episode
from shared.llm.client import LLMClient
from shared.messages import Sampling

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("env_name", ["toolbox", "helpdesk"])
async def test_smollm2_plays_real_episodes(llm: LLMClient, env_name: str) -> None:
    env = get_environment(env_name)
    task = next(t for t in env.tasks() if t.split == "train")
    result = await run_episode(
        llm,
        "smollm2",
        env,
        task,
        int(task.data.get("seed", 0)),
        sampling=Sampling(temperature=0, max_tokens=64),
        max_turns=2,
    )
    assert result.error is None, result.error
    assert 1 <= result.turns <= 2 and result.tokens > 0
    assert result.messages[0]["role"] == "system" and result.messages[1]["role"] == "user"
    assert any(m["role"] == "assistant" for m in result.messages)
    assert 0.0 <= result.score.reward <= 1.0
    assert result.score.breakdown  # scored by the environment's checks
