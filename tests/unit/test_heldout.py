"""The held-out check of a new adapter: both models play the same test (task, seed) pairs
with the same sampling seeds, unhinted, and the gain comes with its paired interval."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="GRPO needs the train extra")

from services.train.grpo import GRPOSettings  # noqa: E402
from services.train.heldout import HeldoutSettings, heldout, heldout_tasks  # noqa: E402
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from tests.support.tiny_model import smollm2_tokenizer, tiny_policy  # noqa: E402

pytestmark = [pytest.mark.slow]
ENV = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
S = GRPOSettings(group_size=2, max_new_tokens=6, max_turns=2, rank=4, alpha=8, hint_share=0.5)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return smollm2_tokenizer()


def test_held_out_tasks_are_test_tasks_in_a_seeded_order() -> None:
    tasks = heldout_tasks(ENV, 5, seed=0)
    assert len(tasks) == 5 and all(t.split == "test" for t in tasks)
    assert tasks == heldout_tasks(ENV, 5, seed=0) and tasks != heldout_tasks(ENV, 5, seed=1)


def test_an_adapter_that_changes_nothing_gains_exactly_nothing(tokenizer: Any) -> None:
    # A fresh LoRA adapter is the identity (B = 0): paired play must give identical rewards.
    policy = tiny_policy(tokenizer, S)
    result = heldout(policy, ENV, S, HeldoutSettings(tasks=3, samples=2, batch=4))
    assert result["episodes"] == 6 and result["tasks"] == 3
    assert result["base_mean"] == result["adapter_mean"]
    assert result["gain"] == 0.0 and result["ci95"] == [0.0, 0.0] and not result["better"]
    assert 0.0 <= result["base_success"]["rate"] <= 1.0


def test_the_base_is_played_with_the_adapter_off(tokenizer: Any) -> None:
    policy = tiny_policy(tokenizer, S)
    with torch.no_grad():  # an adapter far from the identity
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 5.0)
    played: list[bool] = []
    original = policy.model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        played.append(
            not policy.model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
        )
        return original(*args, **kwargs)

    policy.model.forward = forward  # type: ignore[method-assign]
    heldout(policy, ENV, S, HeldoutSettings(tasks=2, samples=1, batch=2))
    assert True in played and False in played  # both models played


def test_no_check_without_tasks(tokenizer: Any) -> None:
    policy = tiny_policy(tokenizer, S)
    assert heldout(policy, ENV, S, HeldoutSettings(tasks=0)) == {}
