"""The real counterpart of the tau2 fakes: SmolLM2 behind `serve-model` plays a short tau2:retail
episode as the agent, and tau2's user simulator runs on the same endpoint through litellm."""

from __future__ import annotations

import pytest

pytest.importorskip("tau2", reason="the tau2 extra is not installed")

from shared.envs.runner import run_episode
from shared.envs.tau2.config import Tau2Config
from shared.envs.tau2.env import Tau2Environment
from shared.llm.client import LLMClient
from shared.messages import Sampling

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_smollm2_plays_a_short_tau2_episode(llm: LLMClient) -> None:
    config = Tau2Config(user_url=llm.base_url, user_model="smollm2", user_max_tokens=32)
    env = Tau2Environment("retail", config)
    task = next(t for t in env.tasks() if t.split == "train")
    result = await run_episode(
        llm,
        "smollm2",
        env,
        task,
        0,
        sampling=Sampling(temperature=0, max_tokens=48),
        max_turns=1,
    )
    assert not result.model_error, result.error
    assert result.turns == 1
    # tau2's opening: the agent's greeting, then the simulator's first message (a real reply).
    assert [m["role"] for m in result.messages[:3]] == ["system", "assistant", "user"]
    assert result.messages[2]["content"].strip()
    assert 0.0 <= result.score.reward <= 1.0
    assert result.score.breakdown or result.score.notes  # scored by tau2's evaluator
