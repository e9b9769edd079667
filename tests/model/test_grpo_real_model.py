"""One real GRPO step of SmolLM2 with a fresh LoRA adapter on a synthetic environment group:
the rollouts are real episodes, and a step with reward variance changes the adapter; the same
rollouts sampled through serve-model (the endpoint path that vLLM takes on a GPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="model tests need the train extra")

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    lora_policy,
    optimizer_for,
    policy_step,
    rollout_group,
)
from services.train.sampling import EndpointSampler  # noqa: E402
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from shared.llm.client import LLMClient  # noqa: E402
from tests.support.models import packaged_or_skip  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_grpo_step_on_smollm2() -> None:
    model_dir = packaged_or_skip("smollm2")
    s = GRPOSettings(group_size=4, max_new_tokens=48, max_turns=2, learning_rate=1e-4)
    policy = lora_policy(str(model_dir), s)
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
    task = next(t for t in env.tasks() if t.split == "train")
    group = rollout_group(policy, env, task, [11, 12, 13, 14], s, sample_seed=3)
    assert len(group) == 4 and all(r.turns for r in group)
    texts = [policy.tokenizer.decode(r.turns[0].completion_ids) for r in group]
    assert len(set(texts)) > 1, texts  # sampled at temperature 1: the group differs
    before = [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_B" in n]
    stats = policy_step(policy, optimizer_for(policy, s), [group], s)
    after = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # a step only moves the adapter when the group's rewards differ
    assert changed == (stats.used == 1), ([r.reward for r in group], stats)


async def test_smollm2_rollouts_sampled_by_serve_model(llm: LLMClient, tmp_path: Path) -> None:
    """The endpoint path of training on the real model: serve-model, sent the adapter, serves
    exactly the policy's weights (the first sync's check measures it) and samples a group of
    real episodes whose tokens the loss can use."""
    s = GRPOSettings(group_size=4, max_new_tokens=48, max_turns=2)
    policy = lora_policy(str(packaged_or_skip("smollm2")), s)
    loop = asyncio.get_running_loop()
    sampler = EndpointSampler(llm, loop, tmp_path / "live", "train-model", policy.end_id)
    env = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
    task = next(t for t in env.tasks() if t.split == "train")
    try:
        await asyncio.to_thread(sampler.sync, policy, 0)
        group = await asyncio.to_thread(
            rollout_group, policy, env, task, [11, 12, 13, 14], s, sample_seed=3, sampler=sampler
        )
    finally:
        await asyncio.to_thread(sampler.close)
    assert sampler.drift is not None and sampler.drift < 1e-3, sampler.drift
    assert len(group) == 4 and all(r.turns for r in group)
    texts = [policy.tokenizer.decode(r.turns[0].completion_ids) for r in group]
    assert len(set(texts)) > 1, texts
    with torch.no_grad():  # every sampled token is one the policy gives a probability
        turn = group[0].turns[0]
        assert torch.isfinite(policy.completion_logprobs(turn, s.temperature)).all()
    assert not [m for m in await llm.models() if m.startswith("train-model-")]
