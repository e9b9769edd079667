"""Accept or reject a synthetic environment from the current policy's rollouts, and retune it.

`calibrate` is the acceptance rule as a pure function of the rewards, grouped per task (one
GRPO group per seed, e.g. 100 seeds x 16 samples): mean reward and success rate inside a band,
few groups where every sample succeeds or every sample scores zero (GRPO learns nothing from a
constant group), and most groups informative.

The bands are judged on intervals, not on the point estimates: an environment is too hard when
the 95% interval of its mean (over tasks, the independent units) lies wholly below the band, or
its mean itself is under `min_point_mean` (0.15: environments accepted lower gave GRPO almost
nothing to learn from), too easy only when the interval lies wholly above. With the paper's 100
tasks the interval is narrow and this is the point rule; with the 4 tasks a CPU can afford per
round, a mean of 0.19 against a floor of 0.2 is noise, and rejecting on it throws away a good
environment and the 10 minutes its calibration cost (docs/benchmarks.md, the demo on Qwen). The
shares of groups (all one, all zero, informative) are judged the same way, on their 95% Wilson
interval: with 4 groups, one all-zero group is 25% against a ceiling of 20%, which rejected the
third demo run's only learnable environment.

The success floor is off by default. The rewards are graded so that GRPO groups have variance
before any sample solves the whole task; an environment whose groups all differ teaches even
when no sample reaches 1.0, and a small model that never finishes a task is exactly the one
that needs it. Set `min_success` (the paper's 0.2) to demand whole successes.

`adjust` moves the family's tuned knobs one step harder or easier, as the result says, and
bumps the spec's revision.

Hints: when the first `hinted` samples of every group saw the task's hint (as that share of a
GRPO group will), the rule judges the groups as GRPO will see them, hinted and unhinted
together, so an environment whose unhinted samples all score 0 is accepted when the hinted
ones give its groups variance; the hinted and unhinted rates are reported apart. The hint
share is the first lever `adjust` pulls when an environment is too hard: up (to
`max_hint_share`) before the knobs get easier, since hints leave the tasks as they are. When
it is too easy the hint share drops a step and the knobs get harder at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from shared.envs.synthetic.families import family_of
from shared.envs.synthetic.spec import KNOB_BOUNDS, SyntheticSpec
from shared.stats import wilson

Direction = Literal["keep", "harder", "easier"]


@dataclass(frozen=True)
class CalibrationConfig:
    seeds: int = 100
    """Tasks rolled out per calibration (the synthesize service's plan)."""
    samples: int = 16
    """Rollouts per task: one GRPO group."""
    max_regenerations: int = 5
    """Adjust-and-retry rounds before the environment is reported as failed."""
    min_mean: float = 0.2
    max_mean: float = 0.6
    """Band for the mean reward over every rollout."""
    min_point_mean: float = 0.15
    """Too hard, whatever the interval says, when the mean itself is below this. Measured
    (docs/benchmarks.md, trace_lift's two CPU runs): the environments accepted on their
    interval at point means 0.113 and 0.144 gave GRPO reward variance in at most 2 groups of
    8, while the one at 0.319 had a nonzero mean reward at all 8 of its steps; 0.19 (noise
    against the 0.2 floor) still passes."""
    min_success: float = 0.0
    max_success: float = 0.6
    """Band for the share of rollouts that succeed (no floor by default: see the module)."""
    max_all_one: float = 0.2
    """Most groups allowed where every sample succeeds."""
    max_all_zero: float = 0.2
    """Most groups allowed where every sample scores 0."""
    min_informative: float = 0.5
    """Fewest groups allowed whose rewards are not all equal."""
    success_reward: float = 1.0
    """A rollout succeeds when its reward reaches this."""
    tolerance: float = 1e-9
    """Rewards closer than this count as equal."""
    hint_step: float = 0.25
    max_hint_share: float = 0.5
    """How far `adjust` moves the hint share per round, and its ceiling (the paper's range
    is 0.25 to 0.5)."""


class CalibrationResult(msgspec.Struct, kw_only=True, frozen=True):
    accepted: bool
    direction: Direction
    """What `adjust` will do: `keep` when accepted."""
    groups: int
    rollouts: int
    mean_reward: float
    success_rate: float
    mean_interval: tuple[float, float] = (0.0, 0.0)
    success_interval: tuple[float, float] = (0.0, 0.0)
    """95% intervals over the tasks' group means (t with groups - 1 degrees of freedom); the
    bands are judged on these."""
    all_one: float
    """Share of groups where every sample succeeded."""
    all_zero: float
    informative: float
    reasons: list[str]
    """Why it was rejected (empty when accepted)."""
    hinted_rollouts: int = 0
    hinted_mean: float | None = None
    hinted_success: float | None = None
    """Over the hinted samples only (None when none was hinted)."""
    unhinted_mean: float | None = None
    unhinted_success: float | None = None
    """Over the samples that saw no hint: the policy on its own."""


DEFAULT_CONFIG = CalibrationConfig()


def calibrate(
    rewards: Mapping[Any, Sequence[float]] | Iterable[Sequence[float]],
    config: CalibrationConfig = DEFAULT_CONFIG,
    hinted: int = 0,
) -> CalibrationResult:
    """Judge rollout rewards grouped per task (a mapping seed -> rewards in trial order, or a
    list of lists); the first `hinted` of each group saw the hint."""
    raw = rewards.values() if isinstance(rewards, Mapping) else rewards
    groups = [list(group) for group in raw if len(group)]
    flat = [r for group in groups for r in group]
    if not flat:
        return CalibrationResult(
            accepted=False, direction="keep", groups=0, rollouts=0, mean_reward=0.0,
            success_rate=0.0, all_one=0.0, all_zero=0.0, informative=0.0,
            reasons=["no rollouts to calibrate on"],
        )  # fmt: skip
    tol = config.tolerance

    def succeeded(reward: float) -> bool:
        return reward >= config.success_reward - tol

    def count(test: Callable[[list[float]], bool]) -> int:
        return sum(1 for group in groups if test(group))

    mean = sum(flat) / len(flat)
    success = sum(1 for r in flat if succeeded(r)) / len(flat)
    mean_ci = _interval([sum(group) / len(group) for group in groups])
    success_ci = _interval([sum(map(succeeded, group)) / len(group) for group in groups])
    n = len(groups)
    all_one = _share(count(lambda group: all(succeeded(r) for r in group)), n)
    all_zero = _share(count(lambda group: all(r <= tol for r in group)), n)
    informative = _share(count(lambda group: max(group) - min(group) > tol), n)
    easy = _easy_reasons(config, (mean, *mean_ci), (success, *success_ci), all_one)
    hard = _hard_reasons(config, (mean, *mean_ci), (success, *success_ci), all_zero)
    reasons = [*easy, *hard]
    if informative[2] < config.min_informative:
        reasons.append(
            f"only {_shown(informative, '.0%')} of groups have differing rewards "
            f"(at least {config.min_informative:.0%})"
        )
    with_hint = [r for group in groups for r in group[:hinted]]
    without = [r for group in groups for r in group[hinted:]]
    return CalibrationResult(
        accepted=not reasons,
        direction=_direction(config, mean, easy, hard) if reasons else "keep",
        groups=len(groups),
        rollouts=len(flat),
        mean_reward=round(mean, 6),
        success_rate=round(success, 6),
        mean_interval=(round(mean_ci[0], 6), round(mean_ci[1], 6)),
        success_interval=(round(success_ci[0], 6), round(success_ci[1], 6)),
        all_one=round(all_one[0], 6),
        all_zero=round(all_zero[0], 6),
        informative=round(informative[0], 6),
        reasons=reasons,
        hinted_rollouts=len(with_hint),
        hinted_mean=_rate(with_hint, lambda r: r),
        hinted_success=_rate(with_hint, lambda r: float(succeeded(r))),
        unhinted_mean=_rate(without, lambda r: r),
        unhinted_success=_rate(without, lambda r: float(succeeded(r))),
    )


def _rate(rewards: list[float], value: Callable[[float], float]) -> float | None:
    return round(sum(value(r) for r in rewards) / len(rewards), 6) if rewards else None


def _direction(
    config: CalibrationConfig, mean: float, easy: list[str], hard: list[str]
) -> Direction:
    """Harder when only too-easy signs show, easier when only too-hard ones do; when both or
    neither do (constant groups at both ends, or at a middling reward), the mean decides."""
    if easy and not hard:
        return "harder"
    if hard and not easy:
        return "easier"
    return "harder" if mean > (config.min_mean + config.max_mean) / 2 else "easier"


Estimate = tuple[float, float, float]
"""A point estimate and its 95% interval: (value, low, high)."""


def _interval(values: list[float]) -> tuple[float, float]:
    """95% t interval of the mean of `values`, clipped to [0, 1]; a single value is its own
    interval (one task says nothing about the spread)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t975(n - 1) * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Student t's 97.5% quantile for 1 to 30 degrees of freedom."""


def _t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def _share(k: int, n: int) -> Estimate:
    """The share k/n and its 95% Wilson score interval (sound at a handful of groups)."""
    return (k / n, *wilson(k, n))


def _shown(estimate: Estimate, spec: str = ".3f") -> str:
    value, low, high = estimate
    return f"{value:{spec}} (95% interval {low:{spec}} to {high:{spec}})"


def _easy_reasons(
    config: CalibrationConfig, mean: Estimate, success: Estimate, ones: Estimate
) -> list[str]:
    reasons = []
    if mean[1] > config.max_mean:
        reasons.append(f"too easy: mean reward {_shown(mean)} above {config.max_mean}")
    if success[1] > config.max_success:
        reasons.append(f"too easy: success rate {_shown(success)} above {config.max_success}")
    if ones[1] > config.max_all_one:
        reasons.append(
            f"too easy: {_shown(ones, '.0%')} of groups succeed in every sample (at most "
            f"{config.max_all_one:.0%})"
        )
    return reasons


def _hard_reasons(
    config: CalibrationConfig, mean: Estimate, success: Estimate, zeros: Estimate
) -> list[str]:
    reasons = []
    if mean[2] < config.min_mean:
        reasons.append(f"too hard: mean reward {_shown(mean)} below {config.min_mean}")
    elif mean[0] < config.min_point_mean:
        reasons.append(
            f"too hard: mean reward {mean[0]:.3f} below {config.min_point_mean} "
            "(environments accepted that low gave GRPO almost no groups with variance)"
        )
    if success[2] < config.min_success:
        reasons.append(f"too hard: success rate {_shown(success)} below {config.min_success}")
    if zeros[1] > config.max_all_zero:
        reasons.append(
            f"too hard: {_shown(zeros, '.0%')} of groups score 0 in every sample (at most "
            f"{config.max_all_zero:.0%})"
        )
    return reasons


def adjust(
    spec: SyntheticSpec, result: CalibrationResult, config: CalibrationConfig = DEFAULT_CONFIG
) -> SyntheticSpec:
    """The spec one step harder or easier, revision bumped. Too hard: the hint share rises a
    step while below `max_hint_share`, else every knob its family tunes moves one step
    easier. Too easy: the hint share drops a step and every tuned knob moves one step harder.

    An accepted result returns the spec unchanged. Knobs stop at their bounds (and
    `distractor_tools` at the number of distractor tools the spec lists); when every knob is
    already there only the revision moves, and the caller's regeneration budget ends the loop.
    """
    if result.direction == "keep":
        return spec
    sign = 1 if result.direction == "harder" else -1
    share = spec.hint_share
    if sign < 0 and share < config.max_hint_share - config.tolerance:
        share = min(config.max_hint_share, share + config.hint_step)
        return msgspec.structs.replace(spec, hint_share=round(share, 4), revision=spec.revision + 1)
    if sign > 0:
        share = max(0.0, share - config.hint_step)
    family = family_of(spec)
    moved: dict[str, Any] = {}
    for knob in family.tunes if family else ():
        low, high, step = KNOB_BOUNDS[knob]
        if knob == "distractor_tools":
            high = min(high, len(spec.offered("distractor")))
        value = getattr(spec.knobs, knob)
        target = min(high, max(low, value + sign * step))
        moved[knob] = int(target) if isinstance(value, int) else round(float(target), 4)
    knobs = msgspec.structs.replace(spec.knobs, **moved)
    return msgspec.structs.replace(
        spec, knobs=knobs, hint_share=round(share, 4), revision=spec.revision + 1
    )
