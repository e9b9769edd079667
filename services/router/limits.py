"""Per-tenant rate limits: a token bucket per tenant, refilled at its rate up to its burst (the
tenant's own quotas, `requests_per_s` and `request_burst`, else the router's
`RETRACE_ROUTER_TENANT_RATE` and `_BURST`). A request over the limit gets a 429 with
`Retry-After` (the seconds until a token is back), before the router does any work for it.

The limit is the tenant's across all router processes of a deployment: each process keeps
its own buckets, tells the others what it let through (`SpendingExchange`, every
`SHARE_INTERVAL_S`, over Postgres notifications: the router needs no NATS), and takes what
they let through out of its own buckets. Every bucket then pays for every request let
through anywhere, so together the processes let a tenant through its rate, give or take a
burst each and what the others let through in the last interval before it was heard of
(`tests/unit/test_router_limits.py` floods two and four processes). A process that cannot
reach the others limits on its own, as one alone does, and what it let through meanwhile
is not told late (it would shut the tenant out elsewhere for nothing)."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg

from shared.logging import get_logger
from shared.store.listening import Listening
from shared.store.quotas import MIN_RATE

log = get_logger(__name__)

CHANNEL = "retrace_router_spent"
VERSION = 1
"""Of the notifications' payload (a process ignores, with a warning, those of another)."""
SHARE_INTERVAL_S = 0.25
CHECK_S = 5.0
"""With nothing to tell, the connection is tried this often (a dead one is replaced)."""
PAYLOAD_BYTES = 7000
"""Postgres takes notification payloads under 8,000 bytes: more tenants go in several."""
MAX_RETRY_AFTER_S = 86_400
OWED_S = 10.0
"""A bucket goes below empty by a burst and this many seconds of its rate at most."""


class Spent(NamedTuple):
    """Requests of a tenant one process let through, at the tenant's rate and burst."""

    requests: int
    rate: float
    burst: int


@dataclass
class _Bucket:
    tokens: float
    updated: float
    rate: float
    burst: int


@dataclass
class Budget:
    """One token bucket: `rate` a second, `burst` at once (the router's store lookups of keys
    it does not hold in memory: `take` says how long to wait when it is spent)."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _updated: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens, self._updated = float(self.burst), self.clock()

    def take(self) -> float:
        """0.0 when a token was spent, else the seconds until one is back."""
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


@dataclass
class TenantLimits:
    """Each tenant's bucket, at the rate and burst its requests come with (its own quota, or
    the router's default)."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _unshared: dict[str, int] = field(default_factory=dict)
    """Requests let through since the other processes were last told, by tenant."""

    def _owed_at_most(self, bucket: _Bucket) -> float:
        """How far other processes' requests may take a bucket below empty: a burst and
        `OWED_S` of the tenant's rate. Every count is then taken whole while the processes
        hear each other (in an interval up to 40 processes let through no more than that
        between them), so each bucket pays for every request let through anywhere and the
        tenant's rate holds in all (a floor at one burst let four processes through 1.3
        times the rate); the floor only bounds a wait if counts ever came in a heap."""
        return bucket.burst + bucket.rate * OWED_S

    def _refilled(self, bucket: _Bucket) -> _Bucket:
        now = self.clock()
        elapsed = now - bucket.updated
        bucket.tokens = min(float(bucket.burst), bucket.tokens + elapsed * bucket.rate)
        bucket.updated = now
        return bucket

    def _bucket(self, tenant: str, rate: float, burst: int) -> _Bucket:
        """The tenant's bucket refilled to now; a full one at `rate` and `burst` where it
        has none."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(burst), self.clock(), rate, burst)
            return bucket
        return self._refilled(bucket)

    def take(self, tenant: str, rate: float, burst: int, cost: int = 1) -> float:
        """0.0 when the request may go on (`cost` tokens are spent), else the seconds to
        wait; `rate` a second, `burst` at once (a changed quota applies from now). A `cost`
        over `burst` never goes on: the caller refuses it first; a negative one is a
        ValueError (it would fill the bucket)."""
        if cost < 0:
            raise ValueError(f"a request costs 0 or more, not {cost}")
        bucket = self._bucket(tenant, rate, burst)
        bucket.rate, bucket.burst = rate, burst
        bucket.tokens = max(-self._owed_at_most(bucket), min(bucket.tokens, float(burst)))
        if bucket.tokens >= cost:
            bucket.tokens -= cost
            self._unshared[tenant] = self._unshared.get(tenant, 0) + cost
            return 0.0
        return (cost - bucket.tokens) / rate

    def unshared(self) -> dict[str, Spent]:
        """The requests let through since the last call, by tenant, with the tenant's rate
        and burst (for the others, which may not have served it yet)."""
        spent, self._unshared = self._unshared, {}
        return {
            t: Spent(n, self._buckets[t].rate, self._buckets[t].burst) for t, n in spent.items()
        }

    def spent_elsewhere(self, tenant: str, spent: Spent) -> None:
        """Another process let `spent.requests` of the tenant's through: they come out of
        this bucket too (one at the tenant's rate and burst where this process has not
        served it yet)."""
        bucket = self._bucket(tenant, spent.rate, spent.burst)
        bucket.tokens = max(-self._owed_at_most(bucket), bucket.tokens - spent.requests)

    def forget_full(self) -> None:
        """Drop the buckets that have filled up again (the same as no bucket), so tenants
        seen once are not kept for ever."""
        full = [
            t
            for t, b in self._buckets.items()
            if t not in self._unshared and self._refilled(b).tokens >= b.burst
        ]
        for tenant in full:
            del self._buckets[tenant]

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """`Retry-After` in whole seconds, at least 1 (a day at most)."""
        return str(max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait_s))))


def payloads(schema: str, sender: str, spent: dict[str, Spent]) -> list[str]:
    """`spent` as notification payloads, JSON objects `{"v", "schema", "from", "spent":
    {tenant: [requests, rate, burst]}}`, each under `PAYLOAD_BYTES`."""
    head = json.dumps({"v": VERSION, "schema": schema, "from": sender, "spent": {}})[:-2]
    out: list[str] = []
    entries: list[str] = []
    size = len(head) + 2
    for tenant, counted in spent.items():
        entry = json.dumps({tenant: list(counted)})[1:-1]
        if entries and size + len(entry) + 2 > PAYLOAD_BYTES:
            out.append(head + ", ".join(entries) + "}}")
            entries, size = [], len(head) + 2
        entries.append(entry)
        size += len(entry) + 2
    if entries:
        out.append(head + ", ".join(entries) + "}}")
    return out


def parse(payload: str) -> tuple[str, str, dict[str, Spent], list[str]]:
    """(schema, sender, spent, refused) of a payload: `refused` says what was wrong with
    each count that is not one, which is left out (another tenant's count in the same
    payload still holds); ValueError when the payload is not one (of this version)."""
    try:
        raw: Any = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        raise ValueError(f"not a version {VERSION} count of requests: {payload[:100]!r}")
    schema, sender, counts = raw.get("schema"), raw.get("from"), raw.get("spent")
    if not isinstance(schema, str) or not isinstance(sender, str) or not isinstance(counts, dict):
        raise ValueError(f"schema, from and spent missing: {payload[:100]!r}")
    spent: dict[str, Spent] = {}
    refused: list[str] = []
    for tenant, counted in counts.items():
        try:
            spent[tenant] = _spent(tenant, counted)
        except ValueError as exc:
            refused.append(str(exc))
    return schema, sender, spent, refused


def _spent(tenant: str, counted: object) -> Spent:
    match counted:
        case [int(n), int() | float() as rate, int(burst)] if (
            0 < len(tenant) <= 63
            and not any(isinstance(v, bool) for v in counted)
            and n > 0
            and burst >= 1
            and MIN_RATE <= rate <= 1e9  # a huge int is refused here, not by float()
        ):
            return Spent(n, float(rate), burst)
        case _:
            raise ValueError(f"not [requests, rate, burst] for {tenant[:63]!r}: {counted!r}")


class SpendingExchange(Listening):
    """Tells the other router processes of the schema what `limits` let through, and takes
    what they let through out of it: one connection that listens on `CHANNEL` and notifies
    on it every `interval_s` (nothing when nothing was let through; the connection tried
    every `CHECK_S` then). Reconnects with backoff; meanwhile the process limits alone,
    and what it let through then is not told."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        limits: TenantLimits,
        *,
        interval_s: float = SHARE_INTERVAL_S,
        retry_s: float = 1.0,
    ) -> None:
        super().__init__(dsn, CHANNEL, f"retrace-rate-limits/{schema}", retry_s=retry_s)
        self.schema = schema
        self.limits = limits
        self.interval_s = interval_s
        self.sender = uuid.uuid4().hex[:12]

    def heard(self, payload: str) -> None:
        try:
            schema, sender, spent, refused = parse(payload)
        except ValueError as exc:
            log.warning("a rate-limit notification that is not one; ignored", error=str(exc))
            return
        if refused:
            log.warning("counts in a rate-limit notification ignored", errors=refused[:5])
        if schema != self.schema or sender == self.sender:
            return
        for tenant, counted in spent.items():
            self.limits.spent_elsewhere(tenant, counted)

    def listening(self) -> None:
        self.limits.unshared()  # let through while deaf: not told late
        log.info("sharing rate limits with the other router processes")

    def lost(self, exc: BaseException, retry_in_s: float) -> None:
        log.warning(
            "rate limits not shared; limiting alone", error=repr(exc), retry_in_s=retry_in_s
        )

    async def serve(self, conn: asyncpg.Connection) -> None:
        """Every interval, what was let through; the connection tried when there was nothing
        to tell for `CHECK_S`; full buckets forgotten every `CHECK_S`."""
        idle = since_pruned = 0.0
        while True:
            await asyncio.sleep(self.interval_s)
            idle += self.interval_s
            since_pruned += self.interval_s
            told = payloads(self.schema, self.sender, self.limits.unshared())
            for payload in told:
                await asyncio.wait_for(
                    conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload), CHECK_S
                )
            if told:
                idle = 0.0
            elif idle >= CHECK_S:  # a dead connection shows here
                await asyncio.wait_for(conn.execute("SELECT 1"), CHECK_S)
                idle = 0.0
            if since_pruned >= CHECK_S:
                self.limits.forget_full()
                since_pruned = 0.0
