"""Per-tenant rate limits: a token bucket per tenant, refilled at its rate up to its burst (the
tenant's own quotas, `requests_per_s` and `request_burst`, else the router's
`RETRACE_ROUTER_TENANT_RATE` and `_BURST`). A request over the limit gets a 429 with
`Retry-After` (the seconds until a token is back), before the router does any work for it.

The limit is the tenant's across all router processes of a deployment: each process keeps
its own buckets, tells the others what it let through (`SpendingExchange`, every
`SHARE_INTERVAL_S`, over Postgres notifications: the router needs no NATS), and takes what
they let through out of its own buckets. So several processes behind a balancer let a
tenant through its rate in all, give or take what they let through in the last
interval (each process's `burst` at most); a process that cannot reach the others limits
on its own, as one alone does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import asyncpg

from shared.logging import get_logger

log = get_logger(__name__)

CHANNEL = "retrace_router_spent"
SHARE_INTERVAL_S = 0.25
PAYLOAD_BYTES = 7000
"""Postgres takes notification payloads under 8,000 bytes: more tenants go in several."""


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
class TenantLimits:
    """Each tenant's bucket, at the rate and burst its requests come with (its own quota, or
    the router's default)."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _unshared: dict[str, int] = field(default_factory=dict)
    """Requests let through since the other processes were last told, by tenant."""

    def _refilled(self, bucket: _Bucket) -> _Bucket:
        now = self.clock()
        elapsed = now - bucket.updated
        bucket.tokens = min(float(bucket.burst), bucket.tokens + elapsed * bucket.rate)
        bucket.updated = now
        return bucket

    def take(self, tenant: str, rate: float, burst: int) -> float:
        """0.0 when the request may go on (a token is spent), else the seconds to wait;
        `rate` requests a second, `burst` at once (a changed quota applies from now)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(burst), self.clock(), rate, burst)
        else:
            self._refilled(bucket)
            bucket.rate, bucket.burst = rate, burst
            bucket.tokens = min(bucket.tokens, float(burst))
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            self._unshared[tenant] = self._unshared.get(tenant, 0) + 1
            return 0.0
        return (1.0 - bucket.tokens) / rate

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
        served it yet), down to one burst owed at most, so a tenant is never shut out for
        long by a count this process heard late."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(
                float(spent.burst), self.clock(), spent.rate, spent.burst
            )
        else:
            self._refilled(bucket)
        bucket.tokens = max(-float(bucket.burst), bucket.tokens - spent.requests)

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """`Retry-After` in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))


def payloads(schema: str, sender: str, spent: dict[str, Spent]) -> list[str]:
    """`spent` as notification payloads `<schema>:<sender>:<json>` (`{tenant: [requests,
    rate, burst]}`), each under `PAYLOAD_BYTES`."""
    out: list[str] = []
    part: dict[str, list[float]] = {}
    head = f"{schema}:{sender}:"
    for tenant, counted in spent.items():
        part[tenant] = list(counted)
        if len(head) + len(json.dumps(part)) > PAYLOAD_BYTES:
            del part[tenant]
            out.append(head + json.dumps(part))
            part = {tenant: list(counted)}
    if part:
        out.append(head + json.dumps(part))
    return out


def parse(payload: str) -> tuple[str, str, dict[str, Spent]]:
    """(schema, sender, spent) of a payload; ValueError when it is not one."""
    schema, sender, body = payload.split(":", 2)
    raw = json.loads(body)
    if not isinstance(raw, dict):
        raise ValueError(f"not requests by tenant: {body[:100]!r}")
    spent: dict[str, Spent] = {}
    for tenant, counted in raw.items():
        match counted:
            case [int(n), int() | float() as rate, int(burst)] if (
                n > 0 and math.isfinite(rate) and rate > 0 and burst >= 1
                and not any(isinstance(v, bool) for v in counted)
            ):  # fmt: skip
                spent[tenant] = Spent(n, float(rate), burst)
            case _:
                raise ValueError(f"not [requests, rate, burst] for {tenant!r}: {counted!r}")
    return schema, sender, spent


class SpendingExchange:
    """Tells the other router processes of the schema what `limits` let through, and takes
    what they let through out of it: one connection that listens on `CHANNEL` and notifies
    on it every `interval_s` (nothing when nothing was let through). Reconnects with
    backoff; while it cannot, the process limits alone."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        limits: TenantLimits,
        *,
        interval_s: float = SHARE_INTERVAL_S,
        retry_s: float = 1.0,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.limits = limits
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.sender = uuid.uuid4().hex[:12]
        self.live = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rate-limit-exchange")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.live = False

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            schema, sender, spent = parse(payload)
        except ValueError as exc:  # json's errors are ValueErrors too
            log.warning("a rate-limit notification that is not one; ignored", error=str(exc))
            return
        if schema != self.schema or sender == self.sender:
            return
        for tenant, counted in spent.items():
            self.limits.spent_elsewhere(tenant, counted)

    async def _run(self) -> None:
        delay = self.retry_s
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self.dsn,
                    timeout=10,
                    server_settings={"application_name": f"retrace-rate-limits/{self.schema}"[:63]},
                )
                await conn.add_listener(CHANNEL, self._heard)
                self.live = True
                delay = self.retry_s
                while True:
                    await asyncio.sleep(self.interval_s)
                    for payload in payloads(self.schema, self.sender, self.limits.unshared()):
                        await asyncio.wait_for(
                            conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload),
                            10 * self.interval_s + 1,
                        )
            except Exception as exc:  # noqa: BLE001  whatever broke it, connect again
                if self.live:
                    log.warning("rate limits no longer shared; limiting alone", error=repr(exc))
                self.live = False
            finally:
                self.live = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
