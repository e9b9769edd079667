"""Evaluation numbers: per-configuration stats, the paired comparison, the oracle ceiling,
and promotion only when the candidate is significantly better."""

from __future__ import annotations

import pytest

from services.evaluator.report import compare, config_stats, oracle, verdict

KINDS = {f"t{i}": ("alarm" if i % 2 else "text") for i in range(30)}


def outcomes(solved: set[str], trials: int = 2) -> dict[str, list[tuple[bool, float]]]:
    return {t: [(t in solved, 1.0 if t in solved else 0.2)] * trials for t in KINDS}


def test_config_stats() -> None:
    s = config_stats("base", outcomes({"t1", "t3"}), KINDS)
    assert s.episodes == 60 and s.successes == 4 and s.pass_rate == pytest.approx(4 / 60)
    assert s.ci95[0] < s.pass_rate < s.ci95[1]
    assert s.by_kind == {"alarm": pytest.approx(4 / 30), "text": 0.0}
    assert s.pass_hat_k["2"] == pytest.approx(2 / 30)
    assert s.mean_reward == pytest.approx((4 * 1.0 + 56 * 0.2) / 60)


def test_a_clearly_better_candidate_is_promoted() -> None:
    base = outcomes({"t1"})
    routed = outcomes({f"t{i}" for i in range(15)})
    c = compare("routed", routed, "base", base, resamples=2000)
    assert c.only_candidate == 28 and c.only_incumbent == 0 and c.mcnemar_p < 1e-6
    assert c.diff == pytest.approx(14 / 30) and c.bootstrap_p < 0.01
    v = verdict(c)
    assert v.promote and "beats base" in v.reason


def test_a_small_or_negative_difference_is_not_promoted_and_says_why() -> None:
    base = outcomes({"t1", "t2"})
    slightly = outcomes({"t1", "t2", "t3"})
    v = verdict(compare("routed", slightly, "base", base, resamples=2000))
    assert not v.promote and "not significantly" in v.reason
    worse = verdict(compare("routed", outcomes(set()), "base", base, resamples=2000))
    assert not worse.promote and "not better" in worse.reason


def test_comparison_needs_shared_tasks() -> None:
    with pytest.raises(ValueError, match="share no task"):
        compare("a", {"x": [(True, 1.0)]}, "b", {"y": [(True, 1.0)]})


def test_oracle_takes_the_best_configuration_per_task() -> None:
    configs = {
        "base": outcomes({"t1"}),
        "alarms": outcomes({"t1", "t3", "t5"}),
        "texts": outcomes({"t2", "t4"}),
    }
    ceiling = oracle(configs)
    assert ceiling["pass_rate"] == pytest.approx(5 / 30)
    assert ceiling["wins:texts"] == 2 and ceiling["wins:alarms"] == 2
    assert ceiling["wins:base"] == 26  # ties (nobody solves it, or base ties) go to base


def test_router_examples_name_the_configuration_that_won_each_train_task() -> None:
    from services.evaluator.routed import learn_examples

    route = {
        "base": {"t1": [(False, 0.2)], "t2": [(True, 1.0)], "t3": [(False, 0.0)]},
        "adapter:alarms": {"t1": [(True, 1.0)], "t2": [(True, 1.0)], "t3": [(False, 0.0)]},
        "adapter:texts": {"t1": [(False, 0.5)], "t3": [(False, 0.4)]},
    }
    openings = {"t1": "set an alarm", "t2": "wake me", "t3": "text Ann", "t4": "unused"}
    examples = learn_examples(route, openings)
    assert [(e.text, e.adapter) for e in examples] == [
        ("set an alarm", "alarms"),  # the adapter did strictly better
        ("wake me", None),  # a tie stays with the base model
        ("text Ann", "texts"),
    ]
