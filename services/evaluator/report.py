"""An evaluation's numbers, as a pure function of its outcomes.

Input: for each configuration (the base model, each single adapter, the routed set, the
current production configuration, baselines), the test-split outcomes per task: one
(success, reward) per trial, trials aligned by index across configurations (same task, same
episode seed), so configurations can be compared pair by pair.

Output per configuration: pass rate with a Wilson 95% interval, pass^k, mean reward, per task
kind; the paired comparison of a candidate against the incumbent (exact McNemar over
(task, trial) pairs, and a paired bootstrap over tasks of the per-task success rate); the
oracle routing ceiling (per task, the best of base and the single adapters); and the promotion
verdict: promote only when the candidate is better with p below `alpha` on both tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import msgspec

from shared.stats import mcnemar_exact, paired_bootstrap, pass_hat_k, wilson

Outcomes = Mapping[str, Sequence[tuple[bool, float]]]
"""task id -> one (success, reward) per trial."""


class ConfigStats(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    episodes: int
    successes: int
    pass_rate: float
    ci95: tuple[float, float]
    mean_reward: float
    pass_hat_k: dict[str, float]
    by_kind: dict[str, float]
    """Task kind -> pass rate."""


class Comparison(msgspec.Struct, kw_only=True, frozen=True):
    candidate: str
    incumbent: str
    tasks: int
    pairs: int
    only_candidate: int
    """(task, trial) pairs the candidate solved and the incumbent did not."""
    only_incumbent: int
    mcnemar_p: float
    diff: float
    """Mean over tasks of (candidate - incumbent) per-task success rate."""
    diff_ci95: tuple[float, float]
    bootstrap_p: float


class Verdict(msgspec.Struct, kw_only=True, frozen=True):
    promote: bool
    reason: str


def config_stats(name: str, outcomes: Outcomes, kinds: Mapping[str, str]) -> ConfigStats:
    flat = [o for trials in outcomes.values() for o in trials]
    successes = sum(1 for ok, _ in flat if ok)
    per_task = [(sum(1 for ok, _ in t if ok), len(t)) for t in outcomes.values()]
    trials = min((n for _, n in per_task), default=0)
    by_kind: dict[str, list[bool]] = {}
    for task, results in outcomes.items():
        by_kind.setdefault(kinds.get(task, "?"), []).extend(ok for ok, _ in results)
    return ConfigStats(
        name=name,
        episodes=len(flat),
        successes=successes,
        pass_rate=successes / len(flat) if flat else 0.0,
        ci95=wilson(successes, len(flat)),
        mean_reward=statistics.fmean(r for _, r in flat) if flat else 0.0,
        pass_hat_k={str(k): pass_hat_k(per_task, k) for k in range(1, trials + 1)},
        by_kind={k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
    )


def compare(
    candidate: str,
    cand: Outcomes,
    incumbent: str,
    inc: Outcomes,
    *,
    resamples: int = 10_000,
    seed: int = 0,
) -> Comparison:
    tasks = sorted(set(cand) & set(inc))
    if not tasks:
        raise ValueError(f"{candidate} and {incumbent} share no task")
    only_c = only_i = pairs = 0
    rate_c: list[float] = []
    rate_i: list[float] = []
    for task in tasks:
        a, b = cand[task], inc[task]
        n = min(len(a), len(b))
        for (ok_c, _), (ok_i, _) in zip(a[:n], b[:n], strict=True):
            pairs += 1
            only_c += ok_c and not ok_i
            only_i += ok_i and not ok_c
        rate_c.append(sum(ok for ok, _ in a[:n]) / n if n else 0.0)
        rate_i.append(sum(ok for ok, _ in b[:n]) / n if n else 0.0)
    diff, ci, p_boot = paired_bootstrap(rate_i, rate_c, resamples=resamples, seed=seed)
    return Comparison(
        candidate=candidate,
        incumbent=incumbent,
        tasks=len(tasks),
        pairs=pairs,
        only_candidate=only_c,
        only_incumbent=only_i,
        mcnemar_p=mcnemar_exact(only_c, only_i),
        diff=diff,
        diff_ci95=ci,
        bootstrap_p=p_boot,
    )


def oracle(configs: Mapping[str, Outcomes]) -> dict[str, float | str]:
    """The routing ceiling: per task, the configuration with the best success rate there
    (ties to the earlier name); its overall pass rate, and which configuration won how often."""
    names = list(configs)
    tasks = sorted(set.intersection(*(set(o) for o in configs.values()))) if configs else []
    successes = episodes = 0
    wins: dict[str, int] = dict.fromkeys(names, 0)
    for task in tasks:

        def rate(name: str, task: str = task) -> float:
            trials = configs[name][task]
            return sum(ok for ok, _ in trials) / len(trials) if trials else 0.0

        best = max(names, key=lambda n: (rate(n), -names.index(n)))
        wins[best] += 1
        trials = configs[best][task]
        successes += sum(ok for ok, _ in trials)
        episodes += len(trials)
    out: dict[str, float | str] = {"pass_rate": successes / episodes if episodes else 0.0}
    out.update({f"wins:{k}": float(v) for k, v in wins.items()})
    return out


def verdict(comparison: Comparison, alpha: float = 0.05) -> Verdict:
    c = comparison
    if c.diff <= 0:
        return Verdict(
            promote=False,
            reason=(
                f"{c.candidate} is not better than {c.incumbent}: per-task success "
                f"difference {c.diff:+.3f} [{c.diff_ci95[0]:+.3f}, {c.diff_ci95[1]:+.3f}]"
            ),
        )
    if c.mcnemar_p >= alpha or c.bootstrap_p >= alpha:
        return Verdict(
            promote=False,
            reason=(
                f"{c.candidate} looks better ({c.diff:+.3f}) but not significantly: McNemar "
                f"p={c.mcnemar_p:.3g} ({c.only_candidate} vs {c.only_incumbent} discordant "
                f"pairs), bootstrap p={c.bootstrap_p:.3g}, alpha {alpha}"
            ),
        )
    return Verdict(
        promote=True,
        reason=(
            f"{c.candidate} beats {c.incumbent} by {c.diff:+.3f} per task "
            f"[{c.diff_ci95[0]:+.3f}, {c.diff_ci95[1]:+.3f}]; McNemar p={c.mcnemar_p:.3g}, "
            f"bootstrap p={c.bootstrap_p:.3g}"
        ),
    )
