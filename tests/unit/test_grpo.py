"""GRPO core on a tiny randomly initialised model with SmolLM2's tokenizer (fast, CPU): group
rollouts keep exact tokens and are seeded; advantages drop constant groups; one step moves
probability towards rewarded completions and away from penalised ones."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="GRPO needs the train extra")

from services.train.grpo import (  # noqa: E402
    GRPOSettings,
    Policy,
    Rollout,
    Turn,
    advantages,
    optimizer_for,
    policy_step,
    rollout_group,
)
from services.train.sampling import LocalSampler  # noqa: E402
from services.train.trainer import Budget, Checkpoints, train  # noqa: E402
from shared.envs.synthetic import SyntheticEnvironment, family_spec  # noqa: E402
from tests.support.length_env import LengthEnvironment  # noqa: E402
from tests.support.tiny_model import smollm2_tokenizer, tiny_policy  # noqa: E402

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return smollm2_tokenizer()


SETTINGS = GRPOSettings(group_size=4, max_new_tokens=6, max_turns=2, rank=4, alpha=8)
ENV = SyntheticEnvironment(family_spec("set_alarm_at_time", "valid_tool_arguments"))


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="group_size"):
        GRPOSettings(group_size=1)
    with pytest.raises(ValueError, match="temperature"):
        GRPOSettings(temperature=0.0)


def test_advantages_center_scale_and_drop_constant_groups() -> None:
    assert advantages([0.5, 0.5, 0.5], scale=True) is None
    assert advantages([1.0, 0.0], scale=False) == [0.5, -0.5]
    scaled = advantages([1.0, 0.0, 0.0, 1.0], scale=True)
    assert scaled is not None and scaled[0] == pytest.approx(1.0, abs=1e-3)
    assert sum(scaled) == pytest.approx(0.0)


def test_a_group_rollout_keeps_exact_tokens_and_repeats_for_a_seed(tokenizer: Any) -> None:
    policy = tiny_policy(tokenizer, SETTINGS)
    task = ENV.tasks()[0]
    first = rollout_group(policy, ENV, task, [1, 2, 3, 4], SETTINGS, sample_seed=7)
    again = rollout_group(policy, ENV, task, [1, 2, 3, 4], SETTINGS, sample_seed=7)
    assert [r.seed for r in first] == [1, 2, 3, 4]
    for r, r2 in zip(first, again, strict=True):
        assert r.turns and [t.completion_ids for t in r.turns] == [
            t.completion_ids for t in r2.turns
        ]
        assert 0.0 <= r.reward <= 1.0 and r.ended in ("done", "max_turns")
        turn = r.turns[0]
        assert 0 < len(turn.completion_ids) <= SETTINGS.max_new_tokens
        # the prompt is the serving template's rendering of the episode's opening
        assert "<|im_start|>system" in tokenizer.decode(turn.prompt_ids)
        assert task.data["request"] in tokenizer.decode(turn.prompt_ids)
        assert r.messages[0]["role"] == "system" and r.messages[-1]["role"] in (
            "assistant",
            "tool",
            "user",
        )
    other = rollout_group(policy, ENV, task, [1, 2, 3, 4], SETTINGS, sample_seed=8)
    assert [t.completion_ids for r in other for t in r.turns] != [
        t.completion_ids for r in first for t in r.turns
    ]


def _logp(policy: Policy, turn: Turn) -> float:
    with torch.no_grad():
        return float(policy.completion_logprobs(turn, 1.0).sum())


def test_one_step_favours_rewarded_completions(tokenizer: Any) -> None:
    s = GRPOSettings(group_size=2, rank=4, alpha=8, learning_rate=5e-3)
    policy = tiny_policy(tokenizer, s)
    prompt = tokenizer("<|im_start|>user\nSet an alarm<|im_end|>\n<|im_start|>assistant\n")[
        "input_ids"
    ]
    good = Turn(prompt, tokenizer("Sure, done.<|im_end|>")["input_ids"])
    bad = Turn(prompt, tokenizer("No way.<|im_end|>")["input_ids"])
    group = [Rollout("t", 0, 1.0, [good]), Rollout("t", 1, 0.0, [bad])]
    before = _logp(policy, good), _logp(policy, bad)
    stats = policy_step(policy, optimizer_for(policy, s), [group], s)
    after = _logp(policy, good), _logp(policy, bad)
    assert stats.used == 1 and stats.rollouts == 2 and stats.completion_tokens > 0
    assert stats.grad_norm > 0
    assert after[0] > before[0] and after[1] < before[1]


def test_a_constant_group_changes_nothing(tokenizer: Any) -> None:
    s = GRPOSettings(group_size=2, rank=4, alpha=8, learning_rate=5e-3)
    policy = tiny_policy(tokenizer, s)
    prompt = tokenizer("<|im_start|>user\nhi<|im_end|>\n")["input_ids"]
    turn = Turn(prompt, tokenizer("hello<|im_end|>")["input_ids"])
    weights = [p.detach().clone() for p in policy.model.parameters() if p.requires_grad]
    stats = policy_step(policy, optimizer_for(policy, s), [[Rollout("t", 0, 1.0, [turn])] * 2], s)
    assert stats.used == 0 and stats.loss == 0.0
    now = [p for p in policy.model.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(weights, now, strict=True))


# -- the training run -----------------------------------------------------------------------

RUN = GRPOSettings(
    group_size=4,
    groups_per_step=1,
    max_new_tokens=8,
    max_turns=1,
    rank=4,
    alpha=8,
    learning_rate=1e-2,
)


def adapter_weights(policy: Policy) -> list[Any]:
    return [p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n]


def test_budget_counts_steps_from_rollouts() -> None:
    assert Budget(rollouts=64).steps(GRPOSettings(group_size=16, groups_per_step=2)) == 2
    assert Budget(rollouts=64, max_steps=1).steps(GRPOSettings(group_size=16)) == 1
    assert Budget(rollouts=10).steps(GRPOSettings(group_size=16)) == 0


def test_a_run_spends_its_budget_records_a_curve_and_learns(tokenizer: Any, tmp_path: Any) -> None:
    policy = tiny_policy(tokenizer, RUN)
    before = adapter_weights(policy)
    seen: list[int] = []
    progress = train(
        policy,
        LengthEnvironment(),
        RUN,
        Budget(rollouts=12),
        Checkpoints(tmp_path / "ck"),
        on_step=lambda p, _: seen.append(p.step),
    )
    assert progress.step == 3 and progress.rollouts == 12 and seen == [1, 2, 3]
    assert [c["step"] for c in progress.curve] == [1, 2, 3]
    assert all(0.0 <= c["mean_reward"] <= 1.0 for c in progress.curve)
    assert any(c["groups_used"] for c in progress.curve)
    assert any(not torch.equal(a, b) for a, b in zip(before, adapter_weights(policy), strict=True))
    assert (tmp_path / "ck" / "adapter" / "adapter_config.json").exists()


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tokenizer: Any, tmp_path: Any) -> None:
    straight = tiny_policy(tokenizer, RUN)
    train(straight, LengthEnvironment(), RUN, Budget(rollouts=12), Checkpoints(tmp_path / "a"))
    first = tiny_policy(tokenizer, RUN)
    steps: list[int] = []
    train(
        first,
        LengthEnvironment(),
        RUN,
        Budget(rollouts=12),
        Checkpoints(tmp_path / "b"),
        on_step=lambda p, _: steps.append(p.step),
        should_stop=lambda: len(steps) >= 1,
    )
    assert steps == [1]  # the "crash": the worker stopped after one checkpointed step
    resumed = tiny_policy(tokenizer, RUN)  # a fresh worker: new model, same base weights
    progress = train(
        resumed, LengthEnvironment(), RUN, Budget(rollouts=12), Checkpoints(tmp_path / "b")
    )
    assert progress.step == 3 and [c["step"] for c in progress.curve] == [1, 2, 3]
    assert progress.resumes == [1]
    for a, b in zip(adapter_weights(straight), adapter_weights(resumed), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


class CountingSampler(LocalSampler):
    """The in-process sampler, recording the batches it decodes and the steps it syncs at."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.batches: list[int] = []
        self.synced: list[int] = []

    def sync(self, policy: Policy, step: int) -> None:
        self.synced.append(step)
        super().sync(policy, step)

    def sample(self, prompts: Any, s: GRPOSettings, seed: int) -> list[list[int]]:
        self.batches.append(len(prompts))
        return super().sample(prompts, s, seed)


AHEAD = dataclasses.replace(RUN, sample_ahead=1)


def test_sampling_ahead_rolls_out_two_steps_at_once_from_the_same_weights(
    tokenizer: Any, tmp_path: Any
) -> None:
    policy = tiny_policy(tokenizer, AHEAD)
    before = adapter_weights(policy)
    sampler = CountingSampler(policy)
    progress = train(
        policy,
        LengthEnvironment(),
        AHEAD,
        Budget(rollouts=16),
        Checkpoints(tmp_path / "ck"),
        sampler=sampler,
    )
    assert progress.step == 4 and progress.rollouts == 16
    assert [c["step"] for c in progress.curve] == [1, 2, 3, 4]
    # one batch of two groups (8 rows) per round; the weights synced before each round only
    assert sampler.batches == [8, 8]
    assert sampler.synced == [0, 2]
    assert any(not torch.equal(a, b) for a, b in zip(before, adapter_weights(policy), strict=True))


def test_a_run_stopped_between_the_steps_of_a_round_resumes_on_the_same_rollouts(
    tokenizer: Any, tmp_path: Any
) -> None:
    straight = tiny_policy(tokenizer, AHEAD)
    train(straight, LengthEnvironment(), AHEAD, Budget(rollouts=16), Checkpoints(tmp_path / "a"))
    first = tiny_policy(tokenizer, AHEAD)
    steps: list[int] = []
    train(
        first,
        LengthEnvironment(),
        AHEAD,
        Budget(rollouts=16),
        Checkpoints(tmp_path / "b"),
        on_step=lambda p, _: steps.append(p.step),
        should_stop=lambda: len(steps) >= 1,
    )
    assert steps == [1]  # stopped with step 2's group sampled and not trained on
    assert (tmp_path / "b" / "pending.json").exists()
    resumed = tiny_policy(tokenizer, AHEAD)
    sampler = CountingSampler(resumed)
    progress = train(
        resumed,
        LengthEnvironment(),
        AHEAD,
        Budget(rollouts=16),
        Checkpoints(tmp_path / "b"),
        sampler=sampler,
    )
    assert progress.step == 4 and progress.resumes == [1]
    assert sampler.batches == [8]  # step 2 trained on the saved rollouts, not new ones
    for a, b in zip(adapter_weights(straight), adapter_weights(resumed), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
