"""Reference demonstrations as the successful side of a diagnosis.

The contrast criterion compares failures with successes. An agent that almost never succeeds
gives it nothing to compare with: with two lucky successes on tasks that needed no tools, "never
calls a tool" is as common among successes as among failures and is rejected, although it is
exactly what the agent lacks. When a diagnosis has fewer agent successes than
`ContrastConfig.min_successes`, the reference solutions of the failed tasks, replayed through
their own environment and graded, join the successes. They are marked (`reference:<task>`
ids) and counted in the evidence, and only references that really score a success are used.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.contrast.trajectory import MalformedTrajectoryError, TrajectoryView
from shared.envs.loading import load_environment, row_ref
from shared.envs.protocol import Environment, Split, TaskSpec
from shared.envs.reference import areplay, replay
from shared.envs.registry import UnknownEnvironmentError
from shared.envs.runner import EpisodeResult
from shared.logging import get_logger
from shared.store.models import Environment as EnvironmentRow
from shared.store.models import Task, Trajectory

log = get_logger(__name__)
PREFIX = "reference:"


def is_reference(trajectory_id: str) -> bool:
    return trajectory_id.startswith(PREFIX)


async def reference_views(
    session: AsyncSession, request_id: uuid.UUID, task_ids: set[str]
) -> list[TrajectoryView]:
    """One graded reference replay per task of `request_id` named in `task_ids`, train split
    only; tasks without a reference, or whose reference does not succeed, are left out."""
    rows = await session.execute(
        select(Task.external_id, Task.kind, Task.split, Task.spec, EnvironmentRow)
        .join(Trajectory, Trajectory.task_id == Task.id)
        .join(EnvironmentRow, EnvironmentRow.id == Task.environment_id)
        .where(Trajectory.request_id == request_id, Task.external_id.in_(sorted(task_ids)))
        .distinct()
        .order_by(Task.external_id)
    )
    tasks: list[tuple[Environment, TaskSpec]] = []
    envs: dict[uuid.UUID, Environment | None] = {}
    for external_id, kind, split, spec, env_row in rows:
        if split != "train":
            continue  # diagnosis never sees test tasks, not even their references
        if env_row.id not in envs:
            envs[env_row.id] = await _environment(session, env_row)
        env = envs[env_row.id]
        if env is not None:
            task = TaskSpec(id=external_id, kind=kind, split=cast(Split, split), data=spec)
            tasks.append((env, task))
    # Replaying is CPU work (building worlds, running tools): off the event loop. Environments
    # whose episodes start asynchronously (HTTP, MCP) are replayed on it, as they await.
    remote = [(env, task) for env, task in tasks if getattr(env, "areset", None) is not None]
    views = await asyncio.to_thread(_replay_all, [p for p in tasks if p not in remote])
    for env, task in remote:
        try:
            result = await areplay(env, task)
        except Exception as exc:  # noqa: BLE001  the environment failed: the reference is left out
            log.warning("reference left out: its replay failed", task=task.id, error=repr(exc))
            continue
        view = _view(task, result)
        if view is not None:
            views.append(view)
    return views


async def _environment(session: AsyncSession, row: EnvironmentRow) -> Environment | None:
    ref = row_ref(row)
    try:
        return await load_environment(session, ref)
    except UnknownEnvironmentError as exc:
        log.warning("no references: environment not loadable", environment=ref, error=str(exc))
        return None


def _replay_all(tasks: list[tuple[Environment, TaskSpec]]) -> list[TrajectoryView]:
    views: list[TrajectoryView] = []
    for env, task in tasks:
        try:
            result = replay(env, task)
        except Exception as exc:  # noqa: BLE001  a malformed reference or a failing environment
            log.warning("reference left out: its replay failed", task=task.id, error=repr(exc))
            continue
        view = _view(task, result)
        if view is not None:
            views.append(view)
    return views


def _view(task: TaskSpec, result: EpisodeResult | None) -> TrajectoryView | None:
    """The replay as a successful trajectory; None without a reference, or when it fails."""
    if result is None:
        return None
    if not result.score.success:
        log.warning(
            "reference left out: it does not succeed",
            task=task.id,
            reward=result.score.reward,
            notes=result.score.notes,
        )
        return None
    try:
        return TrajectoryView.from_stored(
            id=f"{PREFIX}{task.id}",
            task_id=task.id,
            task_kind=task.kind,
            success=True,
            reward=result.score.reward,
            messages=result.messages,
            reward_breakdown={"calls": result.calls, "error": None, "opening": result.opening},
        )
    except MalformedTrajectoryError as exc:
        log.warning("reference left out", task=task.id, error=str(exc))
        return None
