"""Agents: a base model, a system prompt and a target environment, per tenant."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.cycle import ACTIVE
from shared.errors import PermanentError
from shared.store import quotas
from shared.store.models import Agent, Capability, Cycle, Tenant, TrainingJob
from shared.store.scope import TENANT_KEY

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")


class AgentExistsError(PermanentError):
    """An agent with that name already exists for the tenant."""


class AgentNotFoundError(PermanentError):
    """No agent with that name for the tenant."""


class TenantNotFoundError(AgentNotFoundError):
    """The session's tenant does not exist (so no agent of it does either)."""


def _is_agent_name(name: str) -> bool:
    return bool(name) and len(name) <= 100 and set(name) <= _NAME_CHARS


def validate_agent_name(name: str) -> str:
    if not _is_agent_name(name):
        raise PermanentError(
            f"invalid agent name {name!r}: use 1-100 lowercase letters, digits, '-' and '_'"
        )
    return name


async def create_agent(
    session: AsyncSession,
    name: str,
    *,
    model: str,
    environment: str,
    system_prompt: str = "",
    config: dict[str, Any] | None = None,
) -> Agent:
    """Insert an agent for the session's tenant."""
    validate_agent_name(name)
    await _tenant_exists(session)  # else the insert fails on its foreign key, SQL and all
    if await session.scalar(select(Agent.id).where(Agent.name == name)) is not None:
        raise AgentExistsError(f"agent {name!r} already exists")
    await quotas.check_agent(session, session.info[TENANT_KEY])
    agent = Agent(
        name=name,
        model=model,
        environment=environment,
        system_prompt=system_prompt,
        config=config or {},
    )
    session.add(agent)
    await session.flush()
    return agent


async def get_agent(session: AsyncSession, name: str) -> Agent:
    # a name no agent can have is not looked up: a U+0000 in it (from a router caller's
    # `model`) would fail the query itself, and read as the store being down
    if not _is_agent_name(name):
        raise AgentNotFoundError(f"no agent named {name!r}")
    agent = await session.scalar(select(Agent).where(Agent.name == name))
    if agent is None:
        await _tenant_exists(session)  # the likelier mistake, when it is the one
        raise AgentNotFoundError(f"no agent named {name!r}")
    return agent


async def _tenant_exists(session: AsyncSession) -> None:
    tenant = session.info.get(TENANT_KEY)
    if tenant is None or await session.get(Tenant, tenant) is None:
        raise TenantNotFoundError(
            f"no tenant {tenant!r}: create it first (`retrace tenant create {tenant}`)"
        )


async def list_agents(session: AsyncSession) -> list[Agent]:
    return list(await session.scalars(select(Agent).order_by(Agent.name)))


FINISHED_JOB_STATES = ("done", "failed", "cancelled")


class AgentBusyError(PermanentError):
    """The agent has work in progress; deleting it would pull the rows from under it."""


async def work_in_progress(session: AsyncSession, agent_id: Any = None) -> list[str]:
    """The session tenant's active cycles and unfinished training jobs (of one agent when
    `agent_id` is given), each as "<kind> <id> (<state>)"."""
    cycles = select(Cycle).where(Cycle.state.in_(ACTIVE))
    jobs = (
        select(TrainingJob)
        .outerjoin(Capability, Capability.id == TrainingJob.capability_id)
        .where(TrainingJob.status.not_in(FINISHED_JOB_STATES))
    )
    if agent_id is not None:
        cycles = cycles.where(Cycle.agent_id == agent_id)
        jobs = jobs.where(Capability.agent_id == agent_id)
    busy = [f"cycle {c.id} ({c.state})" for c in await session.scalars(cycles)]
    busy += [f"training job {j.id} ({j.status})" for j in await session.scalars(jobs)]
    return busy


async def delete_agent(session: AsyncSession, name: str) -> Agent:
    """Delete the session tenant's agent `name` with everything recorded for it (cycles,
    trajectories, capabilities, adapters' rows, conversations: the foreign keys cascade);
    refused while it has a cycle or a training job in progress."""
    agent = await get_agent(session, name)
    busy = await work_in_progress(session, agent.id)
    if busy:
        raise AgentBusyError(
            f"agent {name!r} has work in progress: {', '.join(busy)}; cancel it first "
            "(`retrace cancel ID`)"
        )
    await session.execute(delete(Agent).where(Agent.id == agent.id))
    return agent
