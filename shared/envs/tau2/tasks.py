"""tau2's tasks as TaskSpecs: tau2's own train/test split, ids kept, a kind per task."""

from __future__ import annotations

from functools import cache
from typing import Any, cast

from shared.envs.protocol import Split, TaskSpec
from shared.envs.tau2.library import domain_module
from shared.errors import PermanentError

NO_WRITE = "no_write"


@cache
def tau2_tasks(domain: str) -> dict[str, Any]:
    """tau2's `Task`s of the domain's base set (its train and test splits), by id."""
    module = domain_module(domain)
    return {task.id: task for task in module.get_tasks("base")}


def tau2_task(domain: str, task_id: str) -> Any:
    """The tau2 `Task` behind a TaskSpec id; a PermanentError for an id tau2 does not have."""
    task = tau2_tasks(domain).get(task_id)
    if task is None:
        raise PermanentError(f"tau2 {domain} has no task {task_id!r}")
    return task


@cache
def task_specs(domain: str) -> tuple[TaskSpec, ...]:
    """Every task of tau2's train and test splits, in tau2's order."""
    module = domain_module(domain)
    splits = module.get_tasks_split()
    split_of: dict[str, Split] = {}
    for name in ("train", "test"):
        for task_id in splits[name]:
            split_of[task_id] = cast(Split, name)
    writes = write_tools(domain)
    return tuple(
        TaskSpec(
            id=task.id,
            kind=kind(domain, task, writes),
            split=split_of[task.id],
            data={"domain": domain},
        )
        for task in tau2_tasks(domain).values()
        if task.id in split_of
    )


def kind(domain: str, task: Any, writes: frozenset[str]) -> str:
    """telecom: the issue category its ids start with (`[mms_issue]...`); airline and retail:
    the first state-changing tool of the gold actions (`no_write` when there is none)."""
    if domain == "telecom" and task.id.startswith("["):
        return str(task.id[1:].partition("]")[0])
    criteria = task.evaluation_criteria
    actions = (criteria.actions or []) if criteria is not None else []
    return next((str(a.name) for a in actions if a.name in writes), NO_WRITE)


@cache
def write_tools(domain: str) -> frozenset[str]:
    """The domain's state-changing tools (tau2 marks them `ToolType.WRITE`)."""
    tools = domain_module(domain).get_environment().tools
    return frozenset(
        name
        for name in tools.get_tools()
        if getattr(getattr(tools, name), "__tool_type__", None) is not None
        and getattr(tools, name).__tool_type__.value == "write"
    )
