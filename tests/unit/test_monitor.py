"""The failure-rate monitor's decision: minimum sample, threshold, hysteresis, cooldown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.evaluator.monitor import MonitorConfig, MonitorState, assess

CFG = MonitorConfig(window=10, min_samples=5, threshold=0.5, rearm=0.3, cooldown_s=100)
BAD = [False] * 6 + [True] * 4  # 60% failures
GOOD = [True] * 8 + [False] * 2  # 20% failures


def test_fires_once_then_waits_for_the_rate_to_fall_and_the_cooldown() -> None:
    first = assess(BAD, MonitorState(), CFG, now=1000, busy=False)
    assert first.fire and first.failure_rate == pytest.approx(0.6) and "60%" in first.why
    assert first.state == MonitorState(armed=False, last_fired=1000)
    again = assess(BAD, first.state, CFG, now=5000, busy=False)
    assert not again.fire and "disarmed" in again.why  # hysteresis, however long it stays bad
    rearmed = assess(GOOD, again.state, CFG, now=1050, busy=False)
    assert not rearmed.fire and rearmed.state.armed
    cooling = assess(BAD, rearmed.state, CFG, now=1060, busy=False)
    assert not cooling.fire and cooling.why == "cooling down"
    assert assess(BAD, rearmed.state, CFG, now=1101, busy=False).fire


def test_no_fire_with_few_samples_below_threshold_or_while_a_cycle_runs() -> None:
    assert not assess([False] * 4, MonitorState(), CFG, now=0, busy=False).fire
    assert not assess(GOOD, MonitorState(), CFG, now=0, busy=False).fire
    busy = assess(BAD, MonitorState(), CFG, now=0, busy=True)
    assert not busy.fire and busy.state.armed  # it fires once the cycle is over


def test_only_the_window_counts() -> None:
    old_failures = [False] * 50 + [True] * 10
    assert assess(old_failures, MonitorState(), CFG, now=0, busy=False).failure_rate == 0.0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="rearm"):
        MonitorConfig(threshold=0.3, rearm=0.5)
    with pytest.raises(ValueError, match="min_samples"):
        MonitorConfig(window=10, min_samples=20)


@given(st.lists(st.booleans(), max_size=40), st.booleans(), st.booleans())
def test_a_firing_always_disarms_and_never_happens_below_threshold(
    outcomes: list[bool], armed: bool, busy: bool
) -> None:
    result = assess(outcomes, MonitorState(armed=armed), CFG, now=10_000, busy=busy)
    if result.fire:
        assert armed and not busy and not result.state.armed
        assert result.failure_rate is not None and result.failure_rate >= CFG.threshold
        assert len(outcomes[-CFG.window :]) >= CFG.min_samples
