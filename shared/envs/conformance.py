"""Checks an environment must pass before retrace runs it: the protocol's promises, tested once
when a plug-in is loaded so a broken one fails with its name and the problem, not with a
traceback from inside a service.

Checked: a `name`; `tasks()` gives TaskSpecs with unique ids and both splits present;
a seeded reset gives an episode whose tools are valid OpenAI function schemas with unique
names, whose opening messages are Messages, and which is the same when reset again with the
same seed. An environment with an async reset (`areset`) is checked in full by `acheck`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
import msgspec

from shared.envs.kit.schema import NAME
from shared.envs.protocol import Environment, Episode, Message, TaskSpec, close, start
from shared.errors import PermanentError

REF = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,63}$")
"""What a plug-in environment's name may look like: it is stored on agents and trajectories and
typed on command lines."""


class BrokenEnvironmentError(PermanentError):
    """An environment that does not keep the protocol's promises; the text names it, where it
    came from and what is wrong."""


def check(env: Environment, origin: str) -> list[TaskSpec]:
    """The structural checks, and the reset checks when the reset is synchronous; returns the
    tasks."""
    tasks = _tasks(env, origin)
    if getattr(env, "areset", None) is None:
        first = [_reset(env, task, origin) for task in _probes(tasks)]
        again = [_reset(env, task, origin) for task in _probes(tasks)]
        _compare(first, again, _probes(tasks), env, origin)
    return tasks


async def acheck(env: Environment, origin: str) -> list[TaskSpec]:
    """Every check, an async reset included."""
    tasks = _tasks(env, origin)

    async def opening(task: TaskSpec) -> dict[str, Any]:
        episode = await _guard(lambda: start(env, task, 0), env, origin, f"reset of {task.id!r}")
        try:
            return _episode(episode, task, env, origin)
        finally:
            await close(episode)  # a probe holds a tool server's process or an HTTP episode

    probes = _probes(tasks)
    first = [await opening(t) for t in probes]
    again = [await opening(t) for t in probes]
    _compare(first, again, probes, env, origin)
    return tasks


def _fail(env: object, origin: str, problem: str) -> BrokenEnvironmentError:
    name = getattr(env, "name", None)
    label = f"environment {name!r}" if isinstance(name, str) else "an environment"
    return BrokenEnvironmentError(f"{label} from {origin}: {problem}")


def _tasks(env: Environment, origin: str) -> list[TaskSpec]:
    name = getattr(env, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise _fail(env, origin, f"its name {name!r} must be a non-empty string")
    try:
        tasks = env.tasks()
    except Exception as exc:  # plug-in code: any failure is reported as the plug-in's
        raise _fail(env, origin, f"tasks() raised {exc!r}") from exc
    if not isinstance(tasks, list) or not tasks:
        raise _fail(env, origin, "tasks() must return a non-empty list of TaskSpec")
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, TaskSpec):
            raise _fail(env, origin, f"tasks() returned a {type(task).__name__}, not a TaskSpec")
        if task.id in seen:
            raise _fail(env, origin, f"task id {task.id!r} appears twice")
        if task.split not in ("train", "test"):
            raise _fail(env, origin, f"task {task.id!r} has split {task.split!r}")
        seen.add(task.id)
    for split in ("train", "test"):
        if not any(t.split == split for t in tasks):
            raise _fail(
                env,
                origin,
                f"no task in the {split!r} split: retrace diagnoses on train and evaluates on test",
            )
    return tasks


def _probes(tasks: list[TaskSpec]) -> list[TaskSpec]:
    """The first task of each split."""
    return [next(t for t in tasks if t.split == split) for split in ("train", "test")]


def _reset(env: Environment, task: TaskSpec, origin: str) -> dict[str, Any]:
    try:
        episode = env.reset(task, 0)
    except Exception as exc:  # plug-in code
        raise _fail(env, origin, f"reset of task {task.id!r} raised {exc!r}") from exc
    return _episode(episode, task, env, origin)


async def _guard(
    call: Callable[[], Awaitable[Episode]], env: Environment, origin: str, what: str
) -> Episode:
    try:
        return await call()
    except Exception as exc:  # plug-in code
        raise _fail(env, origin, f"{what} raised {exc!r}") from exc


def _episode(episode: Episode, task: TaskSpec, env: Environment, origin: str) -> dict[str, Any]:
    """The episode's opening as plain data, after checking its shape."""
    where = f"the episode of task {task.id!r}"
    prompt = getattr(episode, "system_prompt", None)
    if not isinstance(prompt, str):
        raise _fail(env, origin, f"{where}: system_prompt must be a string")
    messages = getattr(episode, "messages", None)
    if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
        raise _fail(env, origin, f"{where}: messages must be a list of Message")
    tools = getattr(episode, "tools", None)
    if not isinstance(tools, list):
        raise _fail(env, origin, f"{where}: tools must be a list of OpenAI tool schemas")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        problem = _schema_problem(tool)
        if problem:
            raise _fail(env, origin, f"{where}: tool {index}: {problem}")
        tool_name = tool["function"]["name"]
        if tool_name in names:
            raise _fail(env, origin, f"{where}: two tools are named {tool_name!r}")
        names.add(tool_name)
    for method in ("step", "score"):
        if not callable(getattr(episode, method, None)):
            raise _fail(env, origin, f"{where}: the episode has no {method}()")
    return {
        "system_prompt": prompt,
        "tools": tools,
        "messages": [msgspec.to_builtins(m) for m in messages],
    }


def _schema_problem(tool: Any) -> str | None:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return 'a tool schema is {"type": "function", "function": {...}}'
    function = tool.get("function")
    if not isinstance(function, dict):
        return "'function' must be an object"
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        return f"function name {name!r} must match {NAME.pattern}"
    if not isinstance(function.get("description", ""), str):
        return f"{name}: description must be a string"
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        return f"{name}: parameters must be a JSON schema of type object"
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        return f"{name}: parameters are not a valid JSON schema: {exc.message}"
    return None


def _compare(
    first: list[dict[str, Any]],
    again: list[dict[str, Any]],
    tasks: list[TaskSpec],
    env: Environment,
    origin: str,
) -> None:
    for a, b, task in zip(first, again, tasks, strict=True):
        for part in ("system_prompt", "tools", "messages"):
            if a[part] != b[part]:
                raise _fail(
                    env,
                    origin,
                    f"reset is not deterministic: two resets of task {task.id!r} with seed 0 "
                    f"gave different {part}",
                )
