"""with_retry: bounded attempts, only the listed errors, a timeout per attempt, bounded delays."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.retry import RetryPolicy, with_retry


def policy(
    attempts: int = 3,
    timeout: float = 1.0,
    retry_on: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError),
) -> RetryPolicy:
    return RetryPolicy(
        "test",
        attempts=attempts,
        base_delay=0.001,
        max_delay=0.002,
        timeout=timeout,
        retry_on=retry_on,
    )


class Script:
    """An outbound call that plays its steps in order: an exception to raise, "hang", or a value.

    The last step repeats once the script runs out.
    """

    def __init__(self, *steps: object) -> None:
        self.steps = steps
        self.calls = 0
        self.raised: list[BaseException] = []
        self.cancelled = 0

    async def __call__(self) -> object:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        if step == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if isinstance(step, type) and issubclass(step, BaseException):
            error = step(f"call {self.calls}")
            self.raised.append(error)
            raise error
        return step


# -- what is retried -------------------------------------------------------------------------


async def test_a_first_success_is_returned_without_retrying() -> None:
    call = Script("ok")
    assert await with_retry(policy(), call) == "ok"
    assert call.calls == 1


async def test_listed_errors_are_retried_until_success() -> None:
    call = Script(OSError, ConnectionResetError, "ok")  # a subclass of a listed type counts
    assert await with_retry(policy(attempts=5), call) == "ok"
    assert call.calls == 3


@pytest.mark.parametrize("error", [ValueError, KeyError, RuntimeError])
async def test_unlisted_errors_are_raised_at_once(error: type[Exception]) -> None:
    call = Script(error, "ok")
    with pytest.raises(error):
        await with_retry(policy(attempts=5, retry_on=(OSError,)), call)
    assert call.calls == 1


@pytest.mark.parametrize("attempts", [1, 2, 4])
async def test_attempts_are_bounded_and_the_last_error_propagates(attempts: int) -> None:
    call = Script(OSError)
    with pytest.raises(OSError) as exc:
        await with_retry(policy(attempts=attempts), call)
    assert call.calls == attempts
    assert exc.value is call.raised[-1]


async def test_the_last_error_propagates_even_when_the_kinds_differ() -> None:
    call = Script(ConnectionRefusedError, TimeoutError, ConnectionResetError)
    with pytest.raises(ConnectionResetError, match="call 3"):
        await with_retry(policy(attempts=3), call)


# -- timeouts and cancellation ---------------------------------------------------------------


async def test_a_hanging_attempt_is_cut_off_and_retried() -> None:
    call = Script("hang", "ok")
    started = time.monotonic()
    assert await with_retry(policy(timeout=0.05), call) == "ok"
    assert call.calls == 2
    assert call.cancelled == 1
    assert time.monotonic() - started < 2


async def test_every_attempt_timing_out_raises_timeout_error() -> None:
    call = Script("hang")
    with pytest.raises(TimeoutError):
        await with_retry(policy(attempts=3, timeout=0.02), call)
    assert call.calls == 3
    assert call.cancelled == 3


async def test_a_timeout_is_not_retried_unless_listed() -> None:
    call = Script("hang", "ok")
    with pytest.raises(TimeoutError):
        await with_retry(policy(attempts=3, timeout=0.02, retry_on=(ValueError,)), call)
    assert call.calls == 1


@pytest.mark.parametrize("broadest", [Exception, BaseException])
async def test_cancellation_is_never_retried(broadest: type[BaseException]) -> None:
    call = Script("hang")
    task = asyncio.create_task(with_retry(policy(attempts=5, retry_on=(broadest,)), call))
    await asyncio.sleep(0.01)  # into the first attempt, well inside its 1 s timeout
    assert call.calls == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.calls == 1


# -- delays ----------------------------------------------------------------------------------


@given(
    attempt=st.integers(min_value=1, max_value=100_000),
    base_delay=st.floats(min_value=0, max_value=1e6),
    max_delay=st.floats(min_value=0, max_value=1e6),
)
def test_delay_stays_within_zero_and_max_delay(
    attempt: int, base_delay: float, max_delay: float
) -> None:
    retry = RetryPolicy("p", attempts=3, base_delay=base_delay, max_delay=max_delay, timeout=1)
    assert 0 <= retry.delay(attempt) <= max_delay


def test_delay_doubles_per_attempt_up_to_max_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    highest: Callable[[float, float], float] = lambda low, high: high  # noqa: E731
    monkeypatch.setattr(random, "uniform", highest)
    retry = RetryPolicy("p", attempts=3, base_delay=0.001, max_delay=0.01, timeout=1)
    assert [retry.delay(n) for n in range(1, 7)] == pytest.approx(
        [0.001, 0.002, 0.004, 0.008, 0.01, 0.01]
    )
    assert retry.delay(5000) == 0.01


def test_delay_is_jittered() -> None:
    retry = RetryPolicy("p", attempts=3, base_delay=1.0, max_delay=1.0, timeout=1)
    assert len({retry.delay(1) for _ in range(20)}) > 1


@pytest.mark.parametrize(
    "fields",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"base_delay": -0.1},
        {"max_delay": -1.0},
        {"timeout": 0},
        {"timeout": -1.0},
        {"timeout": float("nan")},
    ],
)
def test_a_nonsensical_policy_is_refused(fields: dict[str, float]) -> None:
    settings = {"attempts": 3, "base_delay": 0.001, "max_delay": 0.01, "timeout": 1.0, **fields}
    with pytest.raises(ValueError, match="'p'"):
        RetryPolicy("p", **settings)  # type: ignore[arg-type]
