"""Per-tenant token buckets (issue 14: no rate limits)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.router.limits import TenantLimits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_and_tenants_apart() -> None:
    clock = Clock()
    limits = TenantLimits(rate=2.0, burst=3, clock=clock)
    assert [limits.take("acme") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.take("acme") == 0.5  # the next token comes in half a second
    assert limits.take("other") == 0.0  # another tenant has its own bucket
    clock.now = 0.5
    assert limits.take("acme") == 0.0
    assert limits.take("acme") > 0
    assert TenantLimits.retry_after(0.2) == "1" and TenantLimits.retry_after(2.1) == "3"


@given(st.floats(0.5, 50), st.integers(1, 20), st.lists(st.floats(0, 2), min_size=1, max_size=60))
def test_never_more_than_the_burst_plus_the_rate_over_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    clock = Clock()
    limits = TenantLimits(rate=rate, burst=burst, clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        wait = limits.take("t")
        assert wait >= 0
        allowed += wait == 0.0
    assert allowed <= burst + rate * clock.now + 1e-6
