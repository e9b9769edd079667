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
