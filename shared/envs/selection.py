"""Choosing a sample of an environment's tasks."""

from __future__ import annotations

from collections import defaultdict

from shared.envs.protocol import TaskSpec


def pick_tasks(tasks: list[TaskSpec], limit: int | None) -> list[TaskSpec]:
    """The first `limit` tasks taken round-robin over kinds (sorted ids), so a small sample still
    covers every kind; all tasks when no limit."""
    if not limit or limit >= len(tasks):
        return tasks
    by_kind: dict[str, list[TaskSpec]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        by_kind[task.kind].append(task)
    picked: list[TaskSpec] = []
    queues = [by_kind[k] for k in sorted(by_kind)]
    while len(picked) < limit:
        for queue in queues:
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return picked
