"""The toolbox task set: 60 tasks per kind, stable ids, a fixed 70/30 train/test split.

Task `<kind>-<nnnn>` uses template `nnnn mod len(templates)` of its kind and a seed derived
from its id, so a task never changes when others are added. Requests within a kind are kept
distinct: a seed whose request repeats an earlier one is redrawn (deterministically).

The split is stratified and stable: indices come in blocks of ten per kind, and within each
block the seven ids with the lowest hash are train, the other three test. So every kind is
exactly 70/30, a task's split depends only on its own block (adding tasks never moves one),
and no list order or Python's salted `hash()` is involved.
"""

from __future__ import annotations

import hashlib

from shared.envs.protocol import Split, TaskSpec
from shared.envs.toolbox.builder import TaskBuilder
from shared.envs.toolbox.templates import TEMPLATES

PER_KIND = 60
BLOCK = 10
TRAIN_PER_BLOCK = 7
KINDS = tuple(TEMPLATES)


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(kind: str, index: int) -> Split:
    start = index - index % BLOCK
    block = [f"{kind}-{i:04d}" for i in range(start, start + BLOCK)]
    ranked = sorted(block, key=lambda task_id: _digest(f"toolbox-split:{task_id}"))
    return "train" if ranked.index(f"{kind}-{index:04d}") < TRAIN_PER_BLOCK else "test"


def generate_tasks() -> list[TaskSpec]:
    tasks: list[TaskSpec] = []
    for kind, templates in TEMPLATES.items():
        seen: set[str] = set()
        for index in range(PER_KIND):
            task_id = f"{kind}-{index:04d}"
            template = templates[index % len(templates)]
            for attempt in range(100):
                builder = TaskBuilder(kind, _digest(f"{task_id}:{attempt}") % 2**31)
                template(builder)
                if builder.request not in seen:
                    break
            else:
                raise RuntimeError(f"{task_id}: template {template.__name__} ran out of requests")
            seen.add(builder.request)
            data = {"template": template.__name__, **builder.data()}
            tasks.append(TaskSpec(id=task_id, kind=kind, split=split_of(kind, index), data=data))
    return tasks
