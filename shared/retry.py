"""Named retry policies for outbound calls: bounded attempts, exponential backoff, jitter."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from shared.logging import get_logger

T = TypeVar("T")
log = get_logger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    name: str
    attempts: int
    base_delay: float
    max_delay: float
    timeout: float
    """Seconds for one attempt."""
    retry_on: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retry policy {self.name!r}: attempts must be at least 1")
        if not (self.base_delay >= 0 and self.max_delay >= 0):
            raise ValueError(f"retry policy {self.name!r}: delays must not be negative")
        if not self.timeout > 0:
            raise ValueError(f"retry policy {self.name!r}: timeout must be positive")

    def delay(self, attempt: int) -> float:
        """Backoff before attempt `attempt + 1` (attempt counts from 1), with full jitter."""
        # A float exponent past 1023 overflows; long before, the delay is max_delay.
        growth = 2.0 ** min(max(attempt - 1, 0), 1023)
        return random.uniform(0, min(self.max_delay, self.base_delay * growth))


async def with_retry(policy: RetryPolicy, call: Callable[[], Awaitable[T]]) -> T:
    """Run `call` under the policy; the last error propagates once attempts are spent."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return await asyncio.wait_for(call(), policy.timeout)
        except asyncio.CancelledError:
            raise  # the caller is stopping; never retried, however broad `retry_on` is
        except policy.retry_on as exc:
            if attempt == policy.attempts:
                raise
            pause = policy.delay(attempt)
            log.warning(
                "retrying",
                policy=policy.name,
                attempt=attempt,
                error=repr(exc),
                pause=round(pause, 2),
            )
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")
