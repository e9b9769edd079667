"""Adapter profiles: what a routing mode compares a task with, read from the store.

An adapter's profile is its capability in words, requests from the train split of its
newest ready training environment, and the opening requests of the failures its capability
was diagnosed on.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.envs.loading import load_environment, synthetic_ref
from shared.routing.modes import Candidate
from shared.store.models import Adapter, Capability, Trajectory
from shared.store.models import Environment as EnvironmentRow


async def profiles(
    session: AsyncSession, adapter_ids: Sequence[uuid.UUID], examples: int
) -> list[Candidate]:
    """The adapters (in the order given, unknown ids left out) with their profiles."""
    rows = {
        a.id: a for a in await session.scalars(select(Adapter).where(Adapter.id.in_(adapter_ids)))
    }
    out = []
    for adapter_id in adapter_ids:
        adapter = rows.get(adapter_id)
        if adapter is None:
            continue
        capability = (
            await session.get(Capability, adapter.capability_id) if adapter.capability_id else None
        )
        out.append(
            Candidate(
                adapter_id=adapter.id,
                name=adapter.name,
                capability=capability.name if capability else adapter.name,
                examples=tuple(await _examples(session, capability, examples)),
            )
        )
    return out


async def _examples(session: AsyncSession, capability: Capability | None, limit: int) -> list[str]:
    if capability is None:
        return []
    texts = [f"{capability.name.replace('_', ' ')}: {capability.definition}"]
    env = await session.scalar(
        select(EnvironmentRow)
        .where(EnvironmentRow.capability_id == capability.id, EnvironmentRow.status == "ready")
        .order_by(EnvironmentRow.version.desc())
    )
    if env is not None:
        built = await load_environment(session, synthetic_ref(env.name, env.version))
        train = [t for t in built.tasks() if t.split == "train"]
        texts += [str(t.data.get("request", "")) for t in train[:limit]]
    ids = []
    for raw in capability.evidence.get("failed_examples", []):
        try:
            ids.append(uuid.UUID(str(raw)))
        except ValueError:
            continue
    if ids:
        rows = await session.scalars(select(Trajectory.messages).where(Trajectory.id.in_(ids)))
        texts += [first_user_text(messages) for messages in rows]
    return [t for t in texts if t.strip()]


ROUTING_CHARS = 2000
"""What routing reads of a request: the embedding model sees its first 256 tokens (about
1,000 characters) anyway, and the classifier's prompt must stay short. Embedding a 2 MiB
message whole took 1.5 to 1.9 s of the router's CPU here, 2,000 characters 0.016 s."""


def first_user_text(messages: Sequence[dict[str, Any]]) -> str:
    """The opening of the first user turn (`ROUTING_CHARS` of it): what routing decides on."""
    text = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
    return text[:ROUTING_CHARS]
