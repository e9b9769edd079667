"""contrast: the TRACE criterion by hand, its repeated labelings, and the whole pipeline on a
planted data set (propose -> evaluate -> merge keeps the cause and rejects the noise)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.contrast.criterion import (
    CapabilityStats,
    CriterionConfig,
    RunStats,
    contrast,
    evaluate,
)
from services.contrast.deterministic import RuleLabeller, propose
from services.contrast.labels import Capability, Label
from services.contrast.merge import merge
from services.contrast.trajectory import TrajectoryView
from tests.support.planted_trajectories import Script, planted

CAPABILITY = Capability("planted_skill", "LACKING when the table says so.")


class TableLabeller:
    """Labels from a table (trajectory id -> label); on `bad_runs` every label is PRESENT,
    as a judge that misses the weakness on those runs would. Records every call."""

    def __init__(self, table: Mapping[str, Any], bad_runs: Sequence[int] = ()) -> None:
        self.table = table
        self.bad_runs = set(bad_runs)
        self.calls: list[tuple[str, str, int]] = []

    def label(self, capability: Capability, trajectory: TrajectoryView, run: int) -> Label:
        self.calls.append((capability.name, trajectory.id, run))
        return "PRESENT" if run in self.bad_runs else self.table[trajectory.id]


def views(outcomes: Sequence[tuple[str, bool]]) -> list[TrajectoryView]:
    return [Script().say("Hello.").view(tid, success) for tid, success in outcomes]


# -- one run, by hand ------------------------------------------------------------------------

SIX = [("f1", False), ("f2", False), ("f3", False), ("s1", True), ("s2", True), ("s3", True)]
SIX_LABELS: dict[str, Label] = {
    "f1": "LACKING",
    "f2": "LACKING",
    "f3": "NA",
    "s1": "LACKING",
    "s2": "PRESENT",
    "s3": "PRESENT",
}


def test_six_trajectories_by_hand() -> None:
    # failed: 2 LACKING, 1 NA -> coverage 2/3, ER- 2/2; successful: 1 LACKING, 2 PRESENT -> ER+ 1/3
    stats = contrast((success, SIX_LABELS[tid]) for tid, success in SIX)
    assert (stats.coverage, stats.er_failed, stats.er_succeeded) == (2 / 3, 1.0, 1 / 3)
    assert stats.delta == pytest.approx(2 / 3)
    assert stats.passes(CriterionConfig())
    assert not stats.passes(CriterionConfig(min_delta=0.7))
    assert not stats.passes(CriterionConfig(min_coverage=0.7))


def test_the_full_set_evaluation_matches_the_hand_computation() -> None:
    trajectories = views(SIX)
    labeller = TableLabeller(SIX_LABELS)
    [stats] = evaluate([CAPABILITY], trajectories, labeller, CriterionConfig(resample=False))
    assert stats.coverage == pytest.approx(2 / 3) and stats.delta == pytest.approx(2 / 3)
    assert stats.er_failed == 1.0 and stats.er_succeeded == pytest.approx(1 / 3)
    assert stats.delta_std == 0.0
    assert (stats.runs_passed, stats.runs, stats.runs_defined, stats.kept) == (10, 10, 10, True)
    assert stats.failures_covered == ["f1", "f2"]
    assert stats.failed_examples == ["f1", "f2"] and stats.succeeded_examples == ["s2", "s3"]


def test_zero_denominators_leave_values_undefined_and_the_run_fails() -> None:
    cfg = CriterionConfig()
    no_failures = contrast([(True, "LACKING"), (True, "PRESENT")])
    assert no_failures == RunStats(None, None, 0.5, None) and not no_failures.passes(cfg)
    all_na_failures = contrast([(False, "NA"), (False, "NA"), (True, "PRESENT")])
    assert all_na_failures == RunStats(0.0, None, 0.0, None) and not all_na_failures.passes(cfg)
    na_successes = contrast([(False, "LACKING"), (True, "NA")])
    assert na_successes == RunStats(1.0, 1.0, None, None) and not na_successes.passes(cfg)
    assert contrast([]) == RunStats(None, None, None, None)


def test_a_capability_never_defined_is_not_kept() -> None:
    trajectories = views([("f1", False), ("f2", False)])
    labeller = TableLabeller({"f1": "LACKING", "f2": "LACKING"})
    [stats] = evaluate([CAPABILITY], trajectories, labeller)
    assert stats.coverage == 1.0 and stats.er_failed == 1.0
    assert stats.delta is None and stats.delta_std is None and stats.er_succeeded is None
    assert (stats.runs_passed, stats.runs_defined, stats.kept) == (0, 0, False)


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["NA", "PRESENT", "LACKING"]))))
def test_rates_stay_in_range(pairs: list[tuple[bool, Label]]) -> None:
    stats = contrast(pairs)
    for rate in (stats.coverage, stats.er_failed, stats.er_succeeded):
        assert rate is None or 0.0 <= rate <= 1.0
    assert stats.delta is None or -1.0 <= stats.delta <= 1.0
    if stats.coverage is not None and stats.er_failed is not None:
        assert stats.coverage <= stats.er_failed


# -- repeated labelings ----------------------------------------------------------------------

# 20 failures all LACKING, 20 successes all PRESENT: every resample of 40 holds both classes
# unless it draws one class 40 times (chance 2 * 2**-40), so each run has coverage 1, delta 1.
SEPARABLE = [(f"f{i}", False) for i in range(20)] + [(f"s{i}", True) for i in range(20)]
SEPARABLE_LABELS: dict[str, Label] = {tid: "PRESENT" if ok else "LACKING" for tid, ok in SEPARABLE}


@pytest.mark.parametrize(
    ("bad_runs", "passed", "kept"),
    [((), 10, True), ((3, 7), 8, True), ((0, 4, 9), 7, False), (tuple(range(10)), 0, False)],
)
def test_stability_counts_the_runs_a_labeller_gets_right(
    bad_runs: tuple[int, ...], passed: int, kept: bool
) -> None:
    labeller = TableLabeller(SEPARABLE_LABELS, bad_runs)
    [stats] = evaluate([CAPABILITY], views(SEPARABLE), labeller)
    assert (stats.runs_passed, stats.kept) == (passed, kept)
    # A bad run sees coverage 0 and delta 0, a good one 1 and 1.
    assert stats.delta == pytest.approx(passed / 10)
    assert stats.coverage == pytest.approx(passed / 10)
    assert stats.delta_std == pytest.approx(math.sqrt(passed / 10 * (1 - passed / 10)))


def test_each_run_labels_each_sampled_trajectory_once_then_the_full_set() -> None:
    trajectories = views(SEPARABLE)
    labeller = TableLabeller(SEPARABLE_LABELS)
    cfg = CriterionConfig(runs=4, min_runs=3, seed=11)
    evaluate([CAPABILITY], trajectories, labeller, cfg)
    for run in range(4):
        sample = random.Random(11 + run).choices(trajectories, k=len(trajectories))
        labelled = [tid for _, tid, r in labeller.calls if r == run]
        assert sorted(labelled) == sorted({t.id for t in sample})
    assert sorted(tid for _, tid, r in labeller.calls if r == 4) == sorted(
        t.id for t in trajectories
    )
    assert {r for _, _, r in labeller.calls} == {0, 1, 2, 3, 4}


def test_a_resample_missing_a_class_fails_its_run() -> None:
    # One failure and one success: a run passes exactly when its resample holds both.
    trajectories = views([("f", False), ("s", True)])
    cfg = CriterionConfig(runs=10, min_runs=1, seed=3)
    [stats] = evaluate(
        [CAPABILITY], trajectories, TableLabeller({"f": "LACKING", "s": "PRESENT"}), cfg
    )
    both = sum(
        len({t.id for t in random.Random(3 + run).choices(trajectories, k=2)}) == 2
        for run in range(10)
    )
    assert 0 < both < 10  # the seed gives a mix, so the count is informative
    assert stats.runs_passed == both == stats.runs_defined


def test_same_seed_same_stats_and_stats_encode() -> None:
    data = planted(seed=5)
    capabilities = propose(data)
    first = evaluate(capabilities, data, RuleLabeller(), CriterionConfig(seed=1))
    again = evaluate(
        propose(planted(seed=5)), planted(seed=5), RuleLabeller(), CriterionConfig(seed=1)
    )
    assert first == again
    other = evaluate(capabilities, data, RuleLabeller(), CriterionConfig(seed=2))
    assert [s.delta for s in other] != [s.delta for s in first]
    decoded = msgspec.json.decode(msgspec.json.encode(first), type=list[CapabilityStats])
    assert decoded == first


def test_bad_inputs_are_value_errors() -> None:
    trajectories = views(SIX)
    with pytest.raises(ValueError, match="no trajectories"):
        evaluate([CAPABILITY], [], RuleLabeller())
    with pytest.raises(ValueError, match="unique"):
        evaluate([CAPABILITY], [*trajectories, trajectories[0]], RuleLabeller())
    with pytest.raises(ValueError, match="capability names must be unique"):
        evaluate([CAPABILITY, CAPABILITY], trajectories, RuleLabeller())
    with pytest.raises(ValueError, match="has no rule"):
        evaluate([CAPABILITY], trajectories, RuleLabeller())
    with pytest.raises(ValueError, match="labeller gave 'MAYBE'"):
        evaluate([CAPABILITY], trajectories, TableLabeller(dict.fromkeys(SIX_LABELS, "MAYBE")))
    with pytest.raises(ValueError, match="min_runs"):
        CriterionConfig(runs=5)
    with pytest.raises(ValueError, match="snake_case"):
        Capability("Recover Errors", "x")
    with pytest.raises(ValueError, match="definition"):
        Capability("recover_errors", " ")


# -- the pipeline on planted data ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipeline_keeps_the_planted_cause_and_rejects_the_noise(seed: int) -> None:
    data = planted(seed=seed)
    proposed = propose(data)
    # Only these two label any failure LACKING: the cause, and the noise (no question asked).
    assert {c.name for c in proposed} == {"valid_tool_arguments", "ask_for_missing_information"}
    stats = {
        s.name: s for s in evaluate(proposed, data, RuleLabeller(), CriterionConfig(seed=seed))
    }
    cause, noise = stats["valid_tool_arguments"], stats["ask_for_missing_information"]
    assert cause.kept and cause.runs_passed == 10
    assert cause.delta is not None and 0.55 < cause.delta < 0.85  # planted: 0.8 - 0.1
    assert len(cause.failures_covered) == 32  # 0.8 of 40 failures
    assert all(tid.startswith("fail-") for tid in cause.failures_covered)
    assert not noise.kept and noise.runs_passed <= 1
    assert noise.delta is not None and abs(noise.delta) < 0.15
    survivors = merge([s for s in stats.values() if s.kept])
    assert [s.name for s in survivors] == ["valid_tool_arguments"]


def test_a_rare_cause_fails_on_coverage_however_sharp() -> None:
    # 3 of 40 failures LACKING, the rest NA; every success PRESENT: ER- 1, delta 1, but
    # coverage 3/40 = 0.075 is below 0.10.
    outcomes = [(f"f{i}", False) for i in range(40)] + [(f"s{i}", True) for i in range(40)]
    table = {
        tid: "PRESENT" if ok else ("LACKING" if tid in {"f0", "f1", "f2"} else "NA")
        for tid, ok in outcomes
    }
    cfg = CriterionConfig(resample=False)
    [stats] = evaluate([CAPABILITY], views(outcomes), TableLabeller(table), cfg)
    assert (stats.coverage, stats.delta, stats.runs_passed, stats.kept) == (0.075, 1.0, 0, False)
    assert stats.failures_covered == ["f0", "f1", "f2"]


def test_propose_drops_capabilities_no_failure_lacks() -> None:
    data = [
        Script().call("set_item", {"id": "x"}, "invalid").say("Sorry.").view("f", False),
        Script().call("set_item", {"id": 1}).say("Done.").view("s", True),
    ]
    names = {c.name for c in propose(data)}
    assert "valid_tool_arguments" in names
    assert "use_existing_tools" not in names and "report_result_to_user" not in names
    # a schema rejection is the arguments' failure, not a refusal to recover from: counted
    # as both, recovery took the argument skill's place (trace_lift's second run)
    assert "recover_from_tool_errors" not in names
    refused = Script().call("set_item", {"id": 9}, "fail").say("Sorry.").view("g", False)
    assert "recover_from_tool_errors" in {c.name for c in propose([*data, refused])}
