"""Per-tenant rate limits: a token bucket per tenant, refilled at `rate` requests a second up
to `burst`. A request over the limit gets a 429 with `Retry-After` (the seconds until a token
is back), before the router does any work for it.

The limit is the tenant's across all router processes of a deployment: each process keeps
its own buckets, tells the others what it let through (`SpendingExchange`, every
`SHARE_INTERVAL_S`, over Postgres notifications: the router needs no NATS), and takes what
they let through out of its own buckets. So several processes behind a balancer let a
tenant through `rate` a second in all, give or take what they let through in the last
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

import asyncpg

from shared.logging import get_logger

log = get_logger(__name__)

CHANNEL = "retrace_router_spent"
SHARE_INTERVAL_S = 0.25
PAYLOAD_BYTES = 7000
"""Postgres takes notification payloads under 8,000 bytes: more tenants go in several."""


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
    _unshared: dict[str, int] = field(default_factory=dict)
    """Requests let through since the other processes were last told, by tenant."""

    def _bucket(self, tenant: str) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        return bucket

    def take(self, tenant: str) -> float:
        """0.0 when the request may go on (a token is spent), else the seconds to wait."""
        bucket = self._bucket(tenant)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            self._unshared[tenant] = self._unshared.get(tenant, 0) + 1
            return 0.0
        return (1.0 - bucket.tokens) / self.rate

    def unshared(self) -> dict[str, int]:
        """The requests let through since the last call, by tenant (for the others)."""
        spent, self._unshared = self._unshared, {}
        return spent

    def spent_elsewhere(self, tenant: str, requests: int) -> None:
        """Another process let `requests` of the tenant's through: they come out of this
        bucket too, down to one burst owed at most (so a tenant is never shut out for long
        by a count this process heard late)."""
        bucket = self._bucket(tenant)
        bucket.tokens = max(-float(self.burst), bucket.tokens - requests)

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """`Retry-After` in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))


def payloads(schema: str, sender: str, spent: dict[str, int]) -> list[str]:
    """`spent` as notification payloads `<schema>:<sender>:<json>`, each under
    `PAYLOAD_BYTES`."""
    out: list[str] = []
    part: dict[str, int] = {}
    head = f"{schema}:{sender}:"
    for tenant, n in spent.items():
        part[tenant] = n
        if len(head) + len(json.dumps(part)) > PAYLOAD_BYTES:
            del part[tenant]
            out.append(head + json.dumps(part))
            part = {tenant: n}
    if part:
        out.append(head + json.dumps(part))
    return out


def parse(payload: str) -> tuple[str, str, dict[str, int]]:
    """(schema, sender, spent) of a payload; ValueError when it is not one."""
    schema, sender, body = payload.split(":", 2)
    spent = json.loads(body)
    if not isinstance(spent, dict) or not all(
        isinstance(t, str) and type(n) is int and n > 0 for t, n in spent.items()
    ):
        raise ValueError(f"not a count of requests by tenant: {body[:100]!r}")
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
        for tenant, n in spent.items():
            self.limits.spent_elsewhere(tenant, n)

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
