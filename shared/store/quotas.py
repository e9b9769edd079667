"""A tenant's quotas: how many agents it may have, cycles it may run at once and start in a
day, and its chat requests a second and tokens a minute through the router
(`services/router/limits.py`). Set by
the operator (`retrace tenant quota`, `PUT /v1/admin/tenants/{id}/quotas`); unset means
unlimited (the request rate: the router's own default). They are checked where the thing is
made, whichever path asked for it: an agent in `create_agent`, a cycle when the evaluator
takes its request (the API also checks before publishing, to answer at once), a chat request
when the router takes it. Each check of the first two locks the tenant's row (FOR NO KEY
UPDATE: rows referencing the tenant are still inserted meanwhile), so two requests racing
for the last unit are served one at a time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from sqlalchemy import ColumnElement, Text, func, literal, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from shared.cycle import ENDED
from shared.errors import PermanentError
from shared.store.models import Agent, Cycle, Tenant

DAY = timedelta(days=1)
Limit = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None
MIN_RATE = 0.001
"""The lowest request rate a tenant may be given (one request in about 17 minutes)."""
Rate = Annotated[float, msgspec.Meta(ge=MIN_RATE, le=1_000_000)] | None
Burst = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None
Tokens = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None


class Quotas(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A tenant's limits; None: no limit."""

    max_agents: Limit = None
    max_active_cycles: Limit = None
    """Cycles under way at once, over all the tenant's agents."""
    max_cycles_per_day: Limit = None
    """Cycles started in any 24 hours (those refused or cancelled before they started not
    counted)."""
    requests_per_s: Rate = None
    """Chat requests a second through the router, sustained, over all its processes (a 429
    with Retry-After above); None: the router's `RETRACE_ROUTER_TENANT_RATE`."""
    request_burst: Burst = None
    """Chat requests at once after a pause, under `requests_per_s`; None: the router's
    `RETRACE_ROUTER_TENANT_BURST`."""
    tokens_per_min: Tokens = None
    """Tokens a minute through the router, over all its processes; a minute's worth at once
    after a pause. A request counts when it is taken, as its prompt's characters / 4 plus
    `n` x its `max_tokens` (the router's per-request cap where it names none), so the
    limit holds before anything is generated (a 429 with Retry-After above); None: the
    router's `RETRACE_ROUTER_TENANT_TOKENS_PER_MIN`."""


class Usage(msgspec.Struct, kw_only=True, frozen=True):
    """What counts against the quotas now."""

    agents: int
    active_cycles: int
    cycles_last_day: int


class QuotaExceededError(PermanentError):
    """The tenant is at one of its quotas; `retry_after_s` when waiting frees one."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def parse(raw: object) -> Quotas:
    """The stored JSON as Quotas (a row written by hand with a bad value reads as a clear
    error, not a silently ignored limit)."""
    try:
        return msgspec.convert(raw or {}, Quotas)
    except msgspec.ValidationError as exc:
        raise PermanentError(f"the tenant's stored quotas are invalid: {exc}") from None


async def _locked_quotas(session: AsyncSession, tenant_id: str) -> Quotas:
    tenant = await session.scalar(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update(key_share=True)  # FOR NO KEY UPDATE
    )
    if tenant is None:
        raise PermanentError(f"no tenant {tenant_id!r}")
    return parse(tenant.quotas)


async def usage(session: AsyncSession, now: datetime | None = None) -> Usage:
    """The session tenant's usage (the session is scoped to one tenant)."""
    since = (now or datetime.now(UTC)) - DAY
    return Usage(
        agents=await _count(session, Agent),
        active_cycles=await _count(session, Cycle, Cycle.state.not_in(ENDED)),
        cycles_last_day=await _count(session, Cycle, Cycle.created_at > since, _started()),
    )


async def _count(session: AsyncSession, model: Any, *where: ColumnElement[bool]) -> int:
    """The session tenant's `model` rows matching `where`."""
    return await session.scalar(select(func.count()).select_from(model).where(*where)) or 0


def _started() -> ColumnElement[bool]:
    """A cycle that ran, or is to run: not one failed before its diagnosis began (refused for
    a quota or an active cycle, cancelled while requested)."""
    return or_(Cycle.state != "failed", Cycle.data.op("?")(literal("diagnosis", Text)))


async def check_agent(session: AsyncSession, tenant_id: str) -> None:
    """Raise QuotaExceededError when the tenant may not have one more agent."""
    limit = (await _locked_quotas(session, tenant_id)).max_agents
    if limit is None:
        return
    have = await _count(session, Agent)
    if have >= limit:
        raise QuotaExceededError(
            f"quota: tenant {tenant_id!r} may have {limit} agent{'s' * (limit != 1)} and has "
            f"{have} (delete one, or ask the operator to raise `max_agents`)"
        )


async def check_cycle(
    session: AsyncSession,
    tenant_id: str,
    now: datetime | None = None,
    besides: uuid.UUID | None = None,
) -> None:
    """Raise QuotaExceededError when the tenant may not start one more cycle now (`besides`:
    the cycle asking, already recorded as requested, which is not counted)."""
    quotas = await _locked_quotas(session, tenant_id)
    now = now or datetime.now(UTC)
    others = Cycle.id != besides if besides is not None else true()
    if quotas.max_active_cycles is not None:
        active = await _count(session, Cycle, Cycle.state.not_in(ENDED), others)
        if active >= quotas.max_active_cycles:
            raise QuotaExceededError(
                f"quota: tenant {tenant_id!r} may run {quotas.max_active_cycles} cycle"
                f"{'s' * (quotas.max_active_cycles != 1)} at once and runs {active} (wait for "
                "one to end, or cancel one)",
                retry_after_s=60 if quotas.max_active_cycles else None,
            )
    if quotas.max_cycles_per_day is not None:
        started = await _count(session, Cycle, Cycle.created_at > now - DAY, _started(), others)
        if started >= quotas.max_cycles_per_day:
            oldest = await session.scalar(
                select(func.min(Cycle.created_at)).where(
                    Cycle.created_at > now - DAY, _started(), others
                )
            )
            wait = (oldest + DAY - now).total_seconds() if oldest is not None else 60
            raise QuotaExceededError(
                f"quota: tenant {tenant_id!r} may start {quotas.max_cycles_per_day} cycle"
                f"{'s' * (quotas.max_cycles_per_day != 1)} a day and started {started} in the "
                "last 24 hours",
                retry_after_s=max(1, int(wait) + 1) if quotas.max_cycles_per_day else None,
            )


async def set_quotas(session: AsyncSession, tenant_id: str, quotas: Quotas) -> Tenant:
    """Replace a tenant's quotas (a cross-tenant session)."""
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise PermanentError(f"no tenant {tenant_id!r}")
    # the limits set only: a process of the version before, during an upgrade, reads them
    # as long as none of its unknown fields is set
    set_ = msgspec.to_builtins(quotas, order="deterministic")
    tenant.quotas = {name: limit for name, limit in set_.items() if limit is not None}
    await session.flush()
    return tenant
