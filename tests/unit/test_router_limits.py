"""Per-tenant token buckets (issue 14: no rate limits), held across router processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.limits import OWED_S, Budget, Spent, TenantLimits, parse, payloads


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


def test_a_cost_takes_that_many_tokens_and_its_wait_is_for_all_of_them() -> None:
    """Tokens a minute: a request costs what it may use (a minute of 600 at 10 a second)."""
    clock = Clock()
    limits = TenantLimits(clock=clock)
    assert limits.take("acme", 10.0, 600, cost=250) == 0.0
    assert limits.take("acme", 10.0, 600, cost=250) == 0.0
    assert limits.take("acme", 10.0, 600, cost=250) == 15.0  # 100 left: 150 more to come
    clock.now = 15.0
    assert limits.take("acme", 10.0, 600, cost=250) == 0.0
    assert limits.unshared()["acme"] == Spent(750, 10.0, 600)  # what others must be told


def test_a_budget_gives_its_burst_then_its_rate() -> None:
    """The router's lookups of keys it does not hold: one bucket for the process."""
    clock = Clock()
    budget = Budget(4.0, 2, clock=clock)
    assert [budget.take(), budget.take()] == [0.0, 0.0]
    assert budget.take() == 0.25
    clock.now = 0.25
    assert budget.take() == 0.0 and budget.take() == 0.25
    clock.now = 100.0  # idle: back to the burst, no more
    assert [budget.take() for _ in range(3)] == [0.0, 0.0, 0.25]


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


def _flooded(routers: int, rate: float, burst: int, share: bool, seconds: float = 10.0) -> int:
    """Requests let through when each of `routers` processes takes the tenant's requests as
    fast as it may (every millisecond, until refused), telling the others what it let
    through every quarter second when they `share`."""
    clock = Clock()
    limits = [TenantLimits(clock=clock) for _ in range(routers)]
    allowed = 0
    for step in range(1, int(seconds * 1000) + 1):
        clock.now = step / 1000
        for one in limits:
            while one.take("acme", rate, burst) == 0.0:
                allowed += 1
        if share and step % 250 == 0:
            told = [one.unshared() for one in limits]
            for i, one in enumerate(limits):
                for j, spent in enumerate(told):
                    for tenant, counted in spent.items() if i != j else ():
                        one.spent_elsewhere(tenant, counted)
    return allowed


@pytest.mark.parametrize(
    ("routers", "rate", "burst"), [(2, 5.0, 4), (2, 1000.0, 20), (4, 1000.0, 20)]
)
def test_processes_that_share_what_they_let_through_hold_the_tenant_to_one_rate(
    routers: int, rate: float, burst: int
) -> None:
    """Alone each process lets the rate through (`routers` times it in all); telling each
    other, the rate once, give or take a burst each and the first interval before they
    heard of each other (a floor at one burst owed let four through 1.3 times a rate of
    1,000 a second: their counts were cut short)."""
    seconds = 10.0
    assert _flooded(routers, rate, burst, share=False) >= routers * rate * seconds
    allowed = _flooded(routers, rate, burst, share=True)
    most = rate * seconds + routers * (burst + rate * 0.25)
    assert rate * seconds * 0.95 <= allowed <= most, allowed


def test_what_others_let_through_is_owed_to_a_floor() -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    limits.spent_elsewhere("acme", Spent(2, 1.0, 3))  # not served here yet: its bucket made
    assert [limits.take("acme", 1.0, 3) for _ in range(2)] == [0.0, 1.0]
    assert limits.unshared() == {"acme": Spent(1, 1.0, 3)}
    limits.spent_elsewhere("acme", Spent(1000, 1.0, 3))  # counts in a heap
    assert limits.take("acme", 1.0, 3) == 1 + 3 + OWED_S  # a burst and OWED_S owed at most
    assert TenantLimits.retry_after(10**9) == "86400"
    assert limits.unshared() == {}  # only what this process let through is told
    clock.now = 100.0
    assert limits.take("acme", 1.0, 3) == 0.0
    assert limits.unshared() == {"acme": Spent(1, 1.0, 3)} and limits.unshared() == {}
    clock.now = 200.0
    limits.forget_full()  # refilled: the same as no bucket
    limits.spent_elsewhere("acme", Spent(3, 1.0, 3))
    assert limits.take("acme", 1.0, 3) == 1.0


def test_a_tenant_s_new_rate_applies_from_its_next_request() -> None:
    clock = Clock()
    limits = TenantLimits(clock=clock)
    assert [limits.take("acme", 1.0, 5) for _ in range(5)] == [0.0] * 5
    clock.now = 1.0  # one token back at the old rate
    assert limits.take("acme", 10.0, 2) == 0.0  # raised: refilled at the rate it had
    assert limits.take("acme", 10.0, 2) == 0.1
    clock.now = 2.0
    assert [limits.take("acme", 10.0, 2) for _ in range(3)] == [0.0, 0.0, 0.1]  # burst 2


tenants = st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=63)


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
        schema, sender, part, refused = parse(payload)
        assert (schema, sender, refused) == ("bench_1", "r1", [])
        heard.update(part)
    assert heard == spent


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "[" * 5000,
        '{"v": 1}',
        '{"v": 2, "schema": "s", "from": "r", "spent": {}}',
        '{"v": 1, "schema": "s", "from": "r", "spent": [1]}',
    ],
)
def test_a_payload_that_is_not_a_count_is_refused(payload: str) -> None:
    with pytest.raises(ValueError):
        parse(payload)


@pytest.mark.parametrize(
    "counted",
    [
        "3",  # rate, burst missing
        "[-1, 1.0, 3]",
        "[0, 1.0, 3]",
        "[1.5, 1.0, 3]",
        "[true, 1.0, 3]",
        "[1, 0, 3]",
        "[1, NaN, 3]",
        "[1, 1e999, 3]",
        "[1, 1" + "0" * 400 + ", 3]",
        "[1, 1.0, 0]",
        "[1, 1.0, 3, 4]",
    ],
)
def test_a_count_that_is_not_one_is_left_out_and_the_others_hold(counted: str) -> None:
    # one bad count used to void the whole payload: every other tenant's count in it too
    payload = (
        '{"v": 1, "schema": "s", "from": "r", "spent": '
        f'{{"acme": {counted}, "globex": [2, 1.0, 3], "": [1, 1.0, 3]}}}}'
    )
    _, _, spent, refused = parse(payload)
    assert spent == {"globex": Spent(2, 1.0, 3)}
    assert len(refused) == 2 and "'acme'" in refused[0]


def test_a_negative_cost_never_fills_a_bucket() -> None:
    limits = TenantLimits(clock=Clock())
    assert limits.take("acme", 5.0, 300, 250) == 0.0
    with pytest.raises(ValueError, match="0 or more"):
        limits.take("acme", 5.0, 300, -1_000_000)
    assert limits.take("acme", 5.0, 300, 250) > 0  # still spent
