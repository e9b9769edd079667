"""Per-tenant token buckets (issue 14: no rate limits), held across router processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.limits import Spent, TenantLimits, parse, payloads


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_and_tenants_apart() -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    assert [limits.take("acme", 2.0, 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.take("acme", 2.0, 3) == 0.5  # the next token comes in half a second
    assert limits.take("other", 2.0, 3) == 0.0  # another tenant has its own bucket
    clock.now = 0.5
    assert limits.take("acme", 2.0, 3) == 0.0
    assert limits.take("acme", 2.0, 3) > 0
    assert TenantLimits.retry_after(0.2) == "1" and TenantLimits.retry_after(2.1) == "3"


@given(st.floats(0.5, 50), st.integers(1, 20), st.lists(st.floats(0, 2), min_size=1, max_size=60))
def test_never_more_than_the_burst_plus_the_rate_over_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        wait = limits.take("t", rate, burst)
        assert wait >= 0
        allowed += wait == 0.0
    assert allowed <= burst + rate * clock.now + 1e-6


def test_processes_that_share_what_they_let_through_hold_the_tenant_to_one_rate() -> None:
    """Two router processes, each hammered by the same tenant for 60 s: alone each lets the
    rate through (twice it in all); telling each other every quarter second, the rate once,
    give or take a burst each and what one interval lets through."""
    rate, burst, seconds, interval = 5.0, 4, 60.0, 0.25
    for share in (False, True):
        clock = Clock()
        routers = [TenantLimits(clock=clock) for _ in range(2)]
        allowed = 0
        steps = int(seconds / 0.01)
        for step in range(1, steps + 1):
            clock.now = step * 0.01
            allowed += sum(r.take("acme", rate, burst) == 0.0 for r in routers)
            if share and step % int(interval / 0.01) == 0:
                told = [r.unshared() for r in routers]
                for r, other in zip(routers, reversed(told), strict=True):
                    for tenant, n in other.items():
                        r.spent_elsewhere(tenant, n)
        if share:
            assert rate * seconds * 0.9 <= allowed <= rate * seconds + 2 * burst + 2 * rate
        else:
            assert allowed >= 2 * rate * seconds


def test_what_others_let_through_is_owed_one_burst_at_most() -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    limits.spent_elsewhere("acme", Spent(2, 1.0, 3))  # not served here yet: its bucket made
    assert [limits.take("acme", 1.0, 3) for _ in range(2)] == [0.0, 1.0]
    assert limits.unshared() == {"acme": Spent(1, 1.0, 3)}
    limits.spent_elsewhere("acme", Spent(1000, 1.0, 3))  # heard late, after a partition
    assert limits.take("acme", 1.0, 3) == 4.0  # three owed, one to come: not 1,000 s
    assert limits.unshared() == {}  # only what this process let through is told
    clock.now = 10.0
    assert limits.take("acme", 1.0, 3) == 0.0
    assert limits.unshared() == {"acme": Spent(1, 1.0, 3)} and limits.unshared() == {}


def test_a_tenant_s_new_rate_applies_from_its_next_request() -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    assert [limits.take("acme", 1.0, 5) for _ in range(5)] == [0.0] * 5
    clock.now = 1.0  # one token back at the old rate
    assert limits.take("acme", 10.0, 2) == 0.0  # raised: refilled at the rate it had
    assert limits.take("acme", 10.0, 2) == 0.1
    clock.now = 2.0
    assert [limits.take("acme", 10.0, 2) for _ in range(3)] == [0.0, 0.0, 0.1]  # burst 2


tenants = st.text(
    st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=63
).filter(lambda t: ":" not in t)


spent_counts = st.builds(
    Spent, st.integers(1, 10**9), st.floats(1e-3, 1e6), st.integers(1, 1_000_000)
)


@given(st.dictionaries(tenants, spent_counts, max_size=500))
def test_counts_go_out_in_payloads_postgres_takes_and_come_back_whole(
    spent: dict[str, Spent],
) -> None:
    out = payloads("bench_1", "r1", spent)
    assert all(len(p.encode()) < 8000 for p in out)
    heard: dict[str, Spent] = {}
    for payload in out:
        schema, sender, part = parse(payload)
        assert (schema, sender) == ("bench_1", "r1")
        heard.update(part)
    assert heard == spent


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "s:r",
        "s:r:{",
        "s:r:[1]",
        's:r:{"acme": 3}',  # a bare count: the rate and burst missing
        's:r:{"acme": [-1, 1.0, 3]}',
        's:r:{"acme": [1.5, 1.0, 3]}',
        's:r:{"acme": [true, 1.0, 3]}',
        's:r:{"acme": [1, 0, 3]}',
        's:r:{"acme": [1, NaN, 3]}',
        's:r:{"acme": [1, 1e999, 3]}',
        's:r:{"acme": [1, 1.0, 0]}',
        's:r:{"acme": [1, 1.0, 3, 4]}',
    ],
)
def test_a_payload_that_is_not_a_count_is_refused(payload: str) -> None:
    with pytest.raises(ValueError):
        parse(payload)
