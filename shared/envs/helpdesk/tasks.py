"""The helpdesk task list: kinds and counts, stable ids, and the fixed 70/30 split per kind.

Task `i` of a kind is built from the first database seed (sha256 of `kind-i-attempt`) whose
database has an order that fits; everything downstream is deterministic, so the list is the
same in every process.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from shared.envs.helpdesk.changes import cancel_order, change_address, exchange_items, return_items
from shared.envs.helpdesk.db import Database, generate
from shared.envs.helpdesk.inquiries import order_status
from shared.envs.helpdesk.refusals import out_of_policy
from shared.envs.protocol import Split, TaskSpec

Builder = Callable[[int, Database, random.Random, int], dict[str, Any] | None]

KINDS: dict[str, tuple[Builder, int]] = {
    "cancel_order": (cancel_order, 25),
    "change_address": (change_address, 20),
    "exchange_items": (exchange_items, 25),
    "return_items": (return_items, 25),
    "order_status": (order_status, 21),
    "out_of_policy": (out_of_policy, 30),
}
"""kind -> (builder, number of tasks)."""
TRAIN_FRACTION = 0.7
_ATTEMPTS = 50


def build_tasks() -> list[TaskSpec]:
    """Every task, with its split; a new list each call, always with the same content."""
    return list(_tasks())


@lru_cache(maxsize=1)
def _tasks() -> tuple[TaskSpec, ...]:
    out = []
    for kind, (builder, count) in KINDS.items():
        ids = [f"{kind}-{i:04d}" for i in range(count)]
        splits = split_ids(ids)
        for i, task_id in enumerate(ids):
            data = _build(kind, builder, i)
            out.append(TaskSpec(id=task_id, kind=kind, split=splits[task_id], data=data))
    return tuple(out)


def split_ids(ids: list[str]) -> dict[str, Split]:
    """70/30 train/test for one kind's ids, ordered by a stable hash of each id."""
    ranked = sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    n_train = round(TRAIN_FRACTION * len(ids))
    return {task_id: ("train" if rank < n_train else "test") for rank, task_id in enumerate(ranked)}


def _build(kind: str, builder: Builder, index: int) -> dict[str, Any]:
    for attempt in range(_ATTEMPTS):
        key = f"{kind}-{index}-{attempt}"
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")
        data = builder(seed, generate(seed), random.Random(f"helpdesk:{key}"), index)
        if data is not None:
            return data
    raise RuntimeError(f"no database fits task {kind} #{index} after {_ATTEMPTS} seeds")
