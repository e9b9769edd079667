"""Small statistics used in reports: intervals for pass rates, pass^k."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (good at small n and near 0 or 1)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_hat_k(successes_per_task: Sequence[tuple[int, int]], k: int) -> float:
    """pass^k (tau-bench): the chance that k trials of a task all succeed, averaged over tasks,
    estimated without bias from c successes in n trials as C(c, k) / C(n, k)."""
    usable = [(c, n) for c, n in successes_per_task if n >= k]
    if not usable:
        return float("nan")
    return sum(math.comb(c, k) / math.comb(n, k) for c, n in usable) / len(usable)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: `b` pairs where only the
    first configuration succeeded, `c` where only the second did (ties carry no evidence)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be non-negative, got {b}, {c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(
    first: Sequence[float], second: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> tuple[float, tuple[float, float], float]:
    """Mean of `second - first` over paired units (e.g. tasks), its 95% percentile interval
    from resampling units with replacement, and a two-sided p-value for "no difference"
    (twice the share of resampled means on the far side of 0, capped at 1)."""
    import random

    if len(first) != len(second):
        raise ValueError(f"paired samples differ in length: {len(first)} vs {len(second)}")
    if not first:
        raise ValueError("no paired units")
    diffs = [b - a for a, b in zip(first, second, strict=True)]
    mean = sum(diffs) / len(diffs)
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low = means[int(0.025 * (resamples - 1))]
    high = means[int(0.975 * (resamples - 1))]
    if all(d == 0 for d in diffs):
        return mean, (low, high), 1.0
    below = sum(1 for m in means if m <= 0) / resamples
    above = sum(1 for m in means if m >= 0) / resamples
    return mean, (low, high), min(1.0, 2 * min(below, above))
