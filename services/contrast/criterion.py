"""The TRACE criterion: does lacking a capability separate failed from successful runs, stably?

One labelling run over a multiset of trajectories gives, for a capability:

- coverage = #LACKING among failed / #failed (NA failures count in the denominator: a
  capability that explains few failures is not worth an adapter);
- ER- = LACKING / (LACKING + PRESENT) among failed, ER+ the same among successful;
- delta = ER- - ER+.

A zero denominator leaves that quantity undefined (None): no failures leaves coverage and
ER- undefined, no failure or no success labelled PRESENT/LACKING leaves its ER undefined, and
delta is undefined with either ER. A run with an undefined coverage or delta does not pass,
and means and spreads are taken over the runs where the value is defined.

`evaluate` repeats the labelling R times, run r on a bootstrap resample (with replacement,
same size) drawn with `random.Random(seed + r)`; every capability sees the same resamples.
A run passes when coverage >= min_coverage and delta >= min_delta; a capability is kept when
at least min_runs of R runs pass. A final labelling of the full set (run index R) gives the
failures a capability covers and example trajectories.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from services.contrast.labels import Capability, Label, Labeller, check_label
from services.contrast.trajectory import TrajectoryView


@dataclass(frozen=True)
class CriterionConfig:
    runs: int = 10
    """Repeated labelings (R)."""
    min_runs: int = 8
    """Passing runs needed to keep a capability."""
    min_coverage: float = 0.10
    """Share of failed trajectories that must be LACKING in a passing run."""
    min_delta: float = 0.20
    """ER- minus ER+ needed in a passing run."""
    seed: int = 0
    """Run r resamples with `random.Random(seed + r)`."""
    resample: bool = True
    """False labels the full set in every run: only labeller noise varies between runs."""
    examples: int = 3
    """Example ids kept per side (LACKING failures, PRESENT successes)."""

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs must be at least 1, got {self.runs}")
        if not 0 <= self.min_runs <= self.runs:
            raise ValueError(f"min_runs must be in [0, runs={self.runs}], got {self.min_runs}")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage must be in [0, 1], got {self.min_coverage}")
        if not -1.0 <= self.min_delta <= 1.0:
            raise ValueError(f"min_delta must be in [-1, 1], got {self.min_delta}")
        if self.examples < 0:
            raise ValueError(f"examples must be non-negative, got {self.examples}")


@dataclass(frozen=True)
class RunStats:
    """The criterion on one labelled multiset; None where a denominator was zero."""

    coverage: float | None
    er_failed: float | None
    er_succeeded: float | None
    delta: float | None

    def passes(self, cfg: CriterionConfig) -> bool:
        return (
            self.coverage is not None
            and self.delta is not None
            and self.coverage >= cfg.min_coverage
            and self.delta >= cfg.min_delta
        )


def contrast(labelled: Iterable[tuple[bool, Label]]) -> RunStats:
    """The criterion over (success, label) pairs; duplicates (from resampling) all count."""
    counts = {(s, label): 0 for s in (False, True) for label in ("NA", "PRESENT", "LACKING")}
    for success, label in labelled:
        counts[(success, label)] += 1
    failed = sum(counts[(False, label)] for label in ("NA", "PRESENT", "LACKING"))
    coverage = _ratio(counts[(False, "LACKING")], failed)
    er_failed = _ratio(counts[(False, "LACKING")], failed - counts[(False, "NA")])
    judged_ok = counts[(True, "LACKING")] + counts[(True, "PRESENT")]
    er_succeeded = _ratio(counts[(True, "LACKING")], judged_ok)
    delta = None if er_failed is None or er_succeeded is None else er_failed - er_succeeded
    return RunStats(coverage, er_failed, er_succeeded, delta)


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


class CapabilityStats(msgspec.Struct, kw_only=True, frozen=True):
    """The criterion's verdict on one capability (means and spread over the runs)."""

    name: str
    definition: str
    coverage: float | None
    delta: float | None
    delta_std: float | None
    """Population standard deviation of delta over the runs where it is defined."""
    er_failed: float | None
    er_succeeded: float | None
    runs_passed: int
    runs: int
    runs_defined: int
    """Runs whose coverage and delta were both defined."""
    kept: bool
    failed_examples: list[str]
    """A few failed trajectories labelled LACKING on the full set."""
    succeeded_examples: list[str]
    """A few successful trajectories labelled PRESENT on the full set."""
    failures_covered: list[str]
    """Every failed trajectory labelled LACKING on the full set, in input order."""
    merged: list[str] = []
    """Names of near-duplicate capabilities merged into this one (see `merge`)."""


def evaluate(
    capabilities: Sequence[Capability],
    trajectories: Sequence[TrajectoryView],
    labeller: Labeller,
    cfg: CriterionConfig | None = None,
) -> list[CapabilityStats]:
    """Each capability's stats, ranked by mean delta (undefined last, then by name)."""
    cfg = cfg or CriterionConfig()
    if not trajectories:
        raise ValueError("no trajectories to contrast")
    ids = [t.id for t in trajectories]
    if len(set(ids)) != len(ids):
        raise ValueError("trajectory ids must be unique within one contrast")
    names = [c.name for c in capabilities]
    if len(set(names)) != len(names):
        raise ValueError(f"capability names must be unique, got {names}")
    samples = [_sample(trajectories, cfg, run) for run in range(cfg.runs)]
    stats = [_evaluate_one(c, trajectories, samples, labeller, cfg) for c in capabilities]
    return sorted(stats, key=rank_key)


def rank_key(stats: CapabilityStats) -> tuple[bool, float, str]:
    """Higher mean delta first; undefined delta last; ties by name."""
    return (stats.delta is None, -(stats.delta or 0.0), stats.name)


def _sample(
    trajectories: Sequence[TrajectoryView], cfg: CriterionConfig, run: int
) -> list[TrajectoryView]:
    if not cfg.resample:
        return list(trajectories)
    rng = random.Random(cfg.seed + run)
    return rng.choices(trajectories, k=len(trajectories))


def _labels(
    capability: Capability,
    trajectories: Iterable[TrajectoryView],
    labeller: Labeller,
    run: int,
) -> dict[str, Label]:
    """One label per distinct trajectory: a resample's duplicates share their labelling."""
    labels: dict[str, Label] = {}
    for t in trajectories:
        if t.id not in labels:
            labels[t.id] = check_label(labeller.label(capability, t, run), capability, t)
    return labels


def _evaluate_one(
    capability: Capability,
    trajectories: Sequence[TrajectoryView],
    samples: list[list[TrajectoryView]],
    labeller: Labeller,
    cfg: CriterionConfig,
) -> CapabilityStats:
    runs: list[RunStats] = []
    for run, sample in enumerate(samples):
        labels = _labels(capability, sample, labeller, run)
        runs.append(contrast((t.success, labels[t.id]) for t in sample))
    full = _labels(capability, trajectories, labeller, cfg.runs)
    covered = [t.id for t in trajectories if not t.success and full[t.id] == "LACKING"]
    present = [t.id for t in trajectories if t.success and full[t.id] == "PRESENT"]
    deltas = [r.delta for r in runs if r.delta is not None]
    passed = sum(r.passes(cfg) for r in runs)
    return CapabilityStats(
        name=capability.name,
        definition=capability.definition,
        coverage=_mean(r.coverage for r in runs),
        delta=_mean(deltas),
        delta_std=statistics.pstdev(deltas) if deltas else None,
        er_failed=_mean(r.er_failed for r in runs),
        er_succeeded=_mean(r.er_succeeded for r in runs),
        runs_passed=passed,
        runs=cfg.runs,
        runs_defined=sum(r.coverage is not None and r.delta is not None for r in runs),
        kept=passed >= cfg.min_runs,
        failed_examples=covered[: cfg.examples],
        succeeded_examples=present[: cfg.examples],
        failures_covered=covered,
    )


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return statistics.fmean(defined) if defined else None
