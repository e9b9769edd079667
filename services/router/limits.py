"""Per-tenant rate limits: a token bucket per tenant, refilled at `rate` requests a second up
to `burst`. A request over the limit gets a 429 with `Retry-After` (the seconds until a token
is back), before the router does any work for it. The buckets live in one router process:
with several processes behind a balancer each enforces the limit on its own share."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class TenantLimits:
    rate: float
    """Requests a second per tenant, sustained."""
    burst: int
    """Requests a tenant may make at once after being idle."""
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, tenant: str) -> float:
        """0.0 when the request may go on (a token is spent), else the seconds to wait."""
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """`Retry-After` in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))
