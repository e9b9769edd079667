"""One real GRPO step of SmolLM2 with a fresh LoRA adapter on a synthetic environment group:
the rollouts are real episodes, and a step with reward variance changes the adapter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="model tests need the train extra")

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    lora_policy,
    optimizer_for,
    policy_step,
    rollout_group,
)
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from shared.serving.model_files import resolve_model  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_grpo_step_on_smollm2() -> None:
    try:
        model_dir = resolve_model("smollm2")
    except Exception as exc:  # noqa: BLE001  the model package may be absent: say so
        pytest.skip(f"SmolLM2 unavailable: {exc}")
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
