"""Target environments and their tasks in Postgres: imported once per tenant, split fixed."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from shared.envs.protocol import Environment, TaskSpec
from shared.errors import PermanentError
from shared.store import Store
from shared.store.models import Environment as EnvironmentRow
from shared.store.models import Task


async def import_tasks(
    store: Store, tenant: str, env: Environment, version: int = 1
) -> tuple[uuid.UUID, dict[str, uuid.UUID]]:
    """Ensure the environment and all its tasks exist for `tenant`; returns the environment's id
    and task ids by external id. Safe to run concurrently and repeatedly."""
    specs = env.tasks()
    async with store.tenant(tenant) as session:
        await session.execute(
            insert(EnvironmentRow)
            .values(
                id=uuid.uuid4(),
                tenant_id=tenant,
                name=env.name,
                version=version,
                kind="target",
                spec={"builtin": env.name},
                status="ready",
                calibration={},
            )
            .on_conflict_do_nothing(index_elements=["tenant_id", "name", "version"])
        )
        env_id = await session.scalar(
            select(EnvironmentRow.id).where(
                EnvironmentRow.name == env.name, EnvironmentRow.version == version
            )
        )
        assert env_id is not None
        existing = set(
            await session.scalars(select(Task.external_id).where(Task.environment_id == env_id))
        )
        missing = [t for t in specs if t.id not in existing]
        for start in range(0, len(missing), 500):
            await session.execute(
                insert(Task).on_conflict_do_nothing(
                    index_elements=["tenant_id", "environment_id", "external_id"]
                ),
                [_row(tenant, env_id, t) for t in missing[start : start + 500]],
            )
        rows = await session.execute(
            select(Task.external_id, Task.id).where(Task.environment_id == env_id)
        )
        return env_id, {external: task_id for external, task_id in rows}


def _row(tenant: str, env_id: uuid.UUID, task: TaskSpec) -> dict[str, object]:
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant,
        "environment_id": env_id,
        "external_id": task.id,
        "split": task.split,
        "kind": task.kind,
        "spec": task.data,
    }


def select_tasks(env: Environment, split: str | None, task_ids: list[str]) -> list[TaskSpec]:
    """The tasks a request names: explicit ids (all must exist), else a whole split, else all."""
    specs = env.tasks()
    if task_ids:
        by_id = {t.id: t for t in specs}
        unknown = [t for t in task_ids if t not in by_id]
        if unknown:
            raise PermanentError(
                f"{env.name} has no tasks {unknown[:5]}{'...' if len(unknown) > 5 else ''}"
            )
        return [by_id[t] for t in task_ids]
    return [t for t in specs if split is None or t.split == split]
