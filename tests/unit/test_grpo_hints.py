"""Hint injection in GRPO: a share of each group samples with the task's hint in its system
turn, and the gradient is computed only on the same conversation without it (the paper's
prompt swap), optionally with a truncated importance weight."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="GRPO needs the train extra")

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    Policy,
    Rollout,
    Turn,
    optimizer_for,
    policy_step,
    rollout_group,
)
from shared.envs.guidance import CLOSE, OPEN, hinted_count, hinted_trials  # noqa: E402
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from tests.support.tiny_model import smollm2_tokenizer, tiny_policy  # noqa: E402

pytestmark = [pytest.mark.slow]
ENV = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))
HINTED = GRPOSettings(group_size=4, max_new_tokens=6, max_turns=2, rank=4, alpha=8, hint_share=0.5)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return smollm2_tokenizer()


def test_hinted_counts() -> None:
    assert hinted_count(16, 0.0) == 0 and hinted_count(16, 0.25) == 4
    assert hinted_count(16, 0.5) == 8 and hinted_count(4, 0.1) == 1
    assert hinted_count(4, 0.99) == 3  # a group keeps one unhinted rollout below share 1
    assert hinted_count(4, 1.0) == 4
    assert hinted_trials(8, 0.25) == frozenset({0, 1})
    with pytest.raises(ValueError, match="hint share"):
        hinted_count(4, 1.5)


def test_synthetic_tasks_carry_a_hint_that_gives_no_solution() -> None:
    for task in ENV.tasks()[:20]:
        hint = ENV.reset(task, 1).hint
        assert "set_alarm" in hint and "HH:MM" in hint
        for args in task.data["expected"].values():
            for matcher in args.values():
                assert str(matcher.get("value", "\0")) not in hint  # no expected value leaks


def test_hinted_rollouts_sample_with_the_hint_and_train_without_it(tokenizer: Any) -> None:
    policy = tiny_policy(tokenizer, HINTED)
    task = ENV.tasks()[0]
    group = rollout_group(policy, ENV, task, [1, 2, 3, 4], HINTED, sample_seed=7)
    assert [r.hinted for r in group] == [True, True, False, False]
    hint = ENV.reset(task, 1).hint
    for rollout in group:
        for turn in rollout.turns:
            sampled = tokenizer.decode(turn.prompt_ids)
            trained = tokenizer.decode(turn.loss_prompt_ids)
            assert OPEN not in trained and hint not in trained
            if rollout.hinted:
                assert f"{OPEN}\n{hint}\n{CLOSE}" in sampled
                # the same conversation, less the guidance block
                assert sampled.replace(f"\n\n{OPEN}\n{hint}\n{CLOSE}", "") == trained
            else:
                assert turn.train_prompt_ids is None and OPEN not in sampled
        # what is kept of the episode is what the policy learns to act on: no hint
        assert OPEN not in str(rollout.messages)


def _forward_inputs(policy: Policy) -> tuple[list[list[int]], Any]:
    """Records the token ids of every forward pass that builds a graph (the gradient's)."""
    seen: list[list[int]] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        if torch.is_grad_enabled():
            seen.append(kwargs["input_ids"][0].tolist())

    handle = policy.model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen, handle


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_no_hinted_token_reaches_the_gradient(tokenizer: Any, correction: str) -> None:
    s = GRPOSettings(**{**HINTED.__dict__, "hint_correction": correction})
    policy = tiny_policy(tokenizer, s)
    task = ENV.tasks()[0]
    group = rollout_group(policy, ENV, task, [1, 2, 3, 4], s, sample_seed=7)
    group[0].reward, group[2].reward = 1.0, 1.0  # variance, hinted rollouts weighted
    group[1].reward, group[3].reward = 0.0, 0.0
    guidance = tokenizer(OPEN, add_special_tokens=False)["input_ids"]
    seen, handle = _forward_inputs(policy)
    try:
        stats = policy_step(policy, optimizer_for(policy, s), [group], s)
    finally:
        handle.remove()
    assert stats.used == 1 and stats.hinted_reward == 0.5 and stats.unhinted_reward == 0.5
    assert len(seen) == sum(len(r.turns) for r in group) + 1  # and the shared prefix, once
    for ids in seen:
        text = tokenizer.decode(ids)
        assert OPEN not in text and not _contains(ids, guidance)


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def _grads(policy: Policy) -> list[Any]:
    return [p.grad.clone() for p in policy.model.parameters() if p.requires_grad]


def test_the_step_equals_one_on_the_unhinted_prompts(tokenizer: Any) -> None:
    """Without correction a hinted rollout's step is exactly the step on the same completions
    after the unhinted prompts: the hinted prompt contributes nothing."""
    s = HINTED
    task = ENV.tasks()[0]
    policy = tiny_policy(tokenizer, s)
    group = rollout_group(policy, ENV, task, [1, 2, 3, 4], s, sample_seed=7)
    for r, reward in zip(group, [1.0, 0.0, 1.0, 0.0], strict=True):
        r.reward = reward
    swapped = [
        Rollout(
            r.task_id,
            r.seed,
            r.reward,
            [Turn(t.loss_prompt_ids, t.completion_ids) for t in r.turns],
        )
        for r in group
    ]
    deltas = []
    for rollouts in (group, swapped):
        fresh = tiny_policy(tokenizer, s)
        before = [p.detach().clone() for p in fresh.model.parameters() if p.requires_grad]
        policy_step(fresh, optimizer_for(fresh, s), [rollouts], s)
        after = [p.detach() for p in fresh.model.parameters() if p.requires_grad]
        deltas.append([a - b for a, b in zip(after, before, strict=True)])
    assert any(d.abs().max() > 0 for d in deltas[0])
    for a, b in zip(*deltas, strict=True):
        torch.testing.assert_close(a, b)


def test_tis_weights_are_the_truncated_ratio(tokenizer: Any) -> None:
    s = GRPOSettings(**{**HINTED.__dict__, "hint_correction": "tis", "tis_cap": 1.5})
    policy = tiny_policy(tokenizer, s)
    task = ENV.tasks()[0]
    group = rollout_group(policy, ENV, task, [1, 2, 3, 4], s, sample_seed=7)
    turn = group[0].turns[0]
    from services.train.grpo import _hint_weights

    with torch.no_grad():
        unhinted = policy.completion_logprobs(turn, s.temperature)
        hinted = policy.completion_logprobs(turn, s.temperature, turn.prompt_ids)
        weights = _hint_weights(policy, turn, unhinted, s)
    assert isinstance(weights, torch.Tensor)
    torch.testing.assert_close(weights, torch.exp(unhinted - hinted).clamp(max=1.5))
    assert float(weights.max()) <= 1.5
    assert _hint_weights(policy, group[3].turns[0], unhinted, s) == 1.0  # unhinted rollout


def test_the_format_bonus_rewards_the_canonical_form_only_when_asked(tokenizer: Any) -> None:
    def rollout(forms: list[str | None]) -> Rollout:
        return Rollout("t", 0, 0.5, turns=[], forms=forms)

    plain, bonus = HINTED, GRPOSettings(**{**HINTED.__dict__, "format_bonus": 0.1})
    tagged, bare, text = rollout(["tagged", None]), rollout(["bare", "tagged"]), rollout([None])
    assert [r.trained_reward(plain) for r in (tagged, bare, text)] == [0.5, 0.5, 0.5]
    assert [r.trained_reward(bonus) for r in (tagged, bare, text)] == pytest.approx(
        [0.6, 0.55, 0.5]
    )
    # rollouts record the form of each turn as the parser read it
    policy = tiny_policy(tokenizer, HINTED)
    group = rollout_group(policy, ENV, ENV.tasks()[0], [1, 2], HINTED, sample_seed=3)
    assert all(len(r.forms) == len(r.turns) for r in group)
