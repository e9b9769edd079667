"""Environments by reference, inside a tenant's session: built-in ones from the registry,
synthetic ones (`synthetic/<name>@<version>`) from their stored spec."""

from __future__ import annotations

from functools import lru_cache

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.envs.protocol import Environment
from shared.envs.registry import UnknownEnvironmentError, get_environment, open_environment
from shared.store.models import Environment as EnvironmentRow

SYNTHETIC = "synthetic/"


def synthetic_ref(name: str, version: int) -> str:
    """`name` is the environment row's name (`synthetic/<spec name>`)."""
    return f"{name}@{version}"


def row_ref(row: EnvironmentRow) -> str:
    """The reference that loads a stored environment: a synthetic one by name and version, a
    target by its name."""
    return synthetic_ref(row.name, row.version) if row.kind == "synthetic" else row.name


def parse_ref(ref: str) -> tuple[str, int]:
    """(row name, version) of an environment reference; built-ins are version 1."""
    if not ref.startswith(SYNTHETIC):
        return ref, 1
    name, _, version = ref.partition("@")
    if not version.isdigit():
        raise UnknownEnvironmentError(f"synthetic environment {ref!r} needs a version: {name}@<n>")
    return name, int(version)


async def load_environment(session: AsyncSession, ref: str) -> Environment:
    name, version = parse_ref(ref)
    if not ref.startswith(SYNTHETIC):
        return await open_environment(ref)
    spec = await session.scalar(
        select(EnvironmentRow.spec).where(
            EnvironmentRow.name == name, EnvironmentRow.version == version
        )
    )
    if spec is None:
        raise UnknownEnvironmentError(f"no synthetic environment {ref!r} for this tenant")
    return _build(msgspec.json.encode(spec))


@lru_cache(maxsize=32)
def _build(raw: bytes) -> Environment:
    """Specs are data: the same bytes give the same environment, built once per process. A
    derived spec (a plug-in target's own tasks) is told apart by its `kind`."""
    from shared.envs.derived.env import DerivedEnvironment
    from shared.envs.derived.spec import decode_derived, is_derived
    from shared.envs.synthetic import SyntheticEnvironment
    from shared.envs.synthetic.spec import decode

    if is_derived(msgspec.json.decode(raw)):
        spec = decode_derived(raw)
        if spec.simulated is not None:  # replayed from snapshots: the target is not needed
            return DerivedEnvironment(spec, None)
        return DerivedEnvironment(spec, get_environment(spec.target))
    return SyntheticEnvironment(decode(raw))
