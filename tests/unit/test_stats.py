"""Statistics for evaluation: exact McNemar and the paired bootstrap, against known values
and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.stats import mcnemar_exact, paired_bootstrap, pass_hat_k, wilson


def test_mcnemar_known_values() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # all 6 discordant pairs one way
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(5, 5) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@given(st.integers(0, 40), st.integers(0, 40))
def test_mcnemar_is_symmetric_and_a_probability(b: int, c: int) -> None:
    p = mcnemar_exact(b, c)
    assert 0.0 < p <= 1.0 and p == mcnemar_exact(c, b)
    if b + c:
        assert mcnemar_exact(b, c + 1) <= p or c < b  # more evidence one way, smaller p


def test_paired_bootstrap_sees_a_real_difference_and_not_a_null_one() -> None:
    base = [0.0] * 20 + [1.0] * 5
    better = [1.0] * 15 + [0.0] * 5 + [1.0] * 5
    mean, (low, high), p = paired_bootstrap(base, better, resamples=2000)
    assert mean == pytest.approx(15 / 25) and 0 < low <= mean <= high and p < 0.01
    mean, (low, high), p = paired_bootstrap(base, base, resamples=500)
    assert mean == 0 and p == 1.0
    noisy = [1.0, 0.0] * 10
    flipped = [0.0, 1.0] * 10
    _, (low, high), p = paired_bootstrap(noisy, flipped, resamples=2000)
    assert low < 0 < high and p > 0.5
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])


def test_interval_and_pass_k_helpers() -> None:
    low, high = wilson(0, 24)
    assert low == pytest.approx(0.0, abs=1e-12) and 0.1 < high < 0.2
    assert pass_hat_k([(2, 2), (1, 2)], 2) == 0.5
