"""The shared prompt prefix in a GRPO step: run once, the gradient is the one the turns give
run whole (tiny model, CPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="GRPO needs the train extra")

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    Turn,
    _common_prefix,
    _prefix_groups,
    policy_step,
    rollout_episodes,
)
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from tests.support.tiny_model import smollm2_tokenizer, tiny_policy  # noqa: E402

pytestmark = [pytest.mark.slow]
ENV = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
BASE = GRPOSettings(
    group_size=4, max_new_tokens=6, max_turns=2, rank=4, alpha=8, hint_share=0.5,
    max_grad_norm=1e9,
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return smollm2_tokenizer()


def _gradient(tokenizer: Any, s: GRPOSettings, rollouts: Any) -> list[Any]:
    """The step's gradient, read off as the change one SGD step of rate 1 makes."""
    policy = tiny_policy(tokenizer, s)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    policy_step(policy, torch.optim.SGD(params, lr=1.0), rollouts, s)
    return [b - p.detach() for b, p in zip(before, params, strict=True)]


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_the_shared_prefix_gives_the_gradient_of_whole_turns(
    tokenizer: Any, correction: str
) -> None:
    s = dataclasses.replace(BASE, hint_correction=correction)
    policy = tiny_policy(tokenizer, s)
    tasks = ENV.tasks()[:2]
    groups = [
        rollout_episodes(
            policy, ENV, [(task, seed) for seed in (1, 2, 3, 4)], s,
            hinted=[True, True, False, False], sample_seed=3,
        )
        for task in tasks
    ]  # fmt: skip
    for group in groups:
        for rollout, reward in zip(group, [1.0, 0.0, 0.5, 0.0], strict=True):
            rollout.reward = reward
    assert sum(len(r.turns) for g in groups for r in g) >= 8  # several turns share a prefix
    shared = _gradient(tokenizer, s, groups)
    whole = _gradient(tokenizer, dataclasses.replace(s, share_prefix=False), groups)
    assert any(g.abs().max() > 0 for g in whole)
    for a, b in zip(shared, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_prefix_runs_once_per_step(tokenizer: Any) -> None:
    policy = tiny_policy(tokenizer, BASE)
    group = rollout_episodes(policy, ENV, [(ENV.tasks()[0], seed) for seed in (1, 2, 3, 4)], BASE)
    for rollout, reward in zip(group, [1.0, 0.0, 0.5, 0.0], strict=True):
        rollout.reward = reward
    lengths: list[int] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        if torch.is_grad_enabled():
            lengths.append(kwargs["input_ids"].shape[1])

    handle = policy.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        policy_step(policy, torch.optim.SGD(policy.model.parameters(), lr=0.0), [group], BASE)
    finally:
        handle.remove()
    turns = [t for r in group for t in r.turns]
    prompts = [t.loss_prompt_ids for t in turns]
    prefix = min(_common_prefix(prompts), min(map(len, prompts)) - 1)
    assert prefix > 100 and len(lengths) == len(turns) + 1
    assert lengths[0] == prefix  # the system turn and the task, once
    assert all(n < prefix for n in lengths[1:])  # each turn runs only what is its own


def test_prefix_groups() -> None:
    end = 9
    a = Turn([1, 2, end, 3, 4, 5] + [6] * 20, [7])
    b = Turn([1, 2, end, 3, 4, 5] + [6] * 20 + [8], [7])
    c = Turn([1, 3, end, 3], [7])
    s = GRPOSettings(group_size=2)
    groups = _prefix_groups([a, b, c], s, end)
    # a and b share 26 tokens; a's last token must stay with the turn: 25; c runs whole
    assert groups == [(25, [0, 1]), (0, [2])]
    assert _prefix_groups([a, b], dataclasses.replace(s, share_prefix=False), end) == [(0, [0, 1])]
    short = [Turn([1, end, 2], [7]), Turn([1, end, 3], [7])]
    assert _prefix_groups(short, s, end) == [(0, [0, 1])]  # too short to be worth a pass
