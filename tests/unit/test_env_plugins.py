"""Plug-in environments: loading by entry point, and the conformance checks that turn a broken
plug-in into one clear error naming it (shared.envs.plugins, shared.envs.conformance)."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from shared.envs import conformance, plugins
from shared.envs.conformance import BrokenEnvironmentError
from shared.envs.registry import UnknownEnvironmentError, available, get_environment

GOOD = '''
from pathlib import Path
from shared.envs.kit import TaskFileEnvironment, ToolError

TASKS = Path(__file__).with_name("tasks.jsonl")

def look(state: dict, key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    if key not in state:
        raise ToolError(f"no {key}")
    return state[key]

class Env(TaskFileEnvironment[dict]):
    name = "NAME"
    task_file = TASKS
    tools = (look,)

    def initial_state(self, task, rng):
        return {"k": str(rng.randrange(1000))}

    def reward(self, task, transcript):
        return 1.0 if transcript.called("look") else 0.0
'''
TASKS = (
    '{"id": "a", "split": "train", "prompt": "look k up"}\n'
    '{"id": "b", "split": "test", "prompt": "again"}\n'
)
RANDOM_OPENING = (
    GOOD
    + """
import random
from shared.envs.kit import Message

class Drifting(Env):
    def first_messages(self, task):
        return [Message(role="user", content=str(random.random()))]
"""
)


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., EntryPoint]:
    """Writes a plug-in module and gives its entry point."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(
        source: str = GOOD, tasks: str = TASKS, attr: str = "Env", name: str = ""
    ) -> EntryPoint:
        module = f"plug_{uuid.uuid4().hex[:8]}"
        env_name = name or module.replace("_", "-")
        package = tmp_path / module
        package.mkdir()
        (package / "__init__.py").write_text(
            textwrap.dedent(source).replace("NAME", env_name), encoding="utf-8"
        )
        (package / "tasks.jsonl").write_text(tasks, encoding="utf-8")
        return EntryPoint(name=env_name, value=f"{module}:{attr}", group=plugins.GROUP)

    return make


def test_a_good_plugin_loads_checked(plugin: Callable[..., EntryPoint]) -> None:
    point = plugin()
    env = plugins.load(point)
    assert env.name == point.name
    assert [t.id for t in env.tasks()] == ["a", "b"]
    assert env.reset(env.tasks()[0], 3).tools[0]["function"]["name"] == "look"


@pytest.mark.parametrize(
    ("source", "tasks", "attr", "problem"),
    [
        ("raise ImportError('missing dependency zzz')", TASKS, "Env", "importing it failed: .*zzz"),
        ("Env = 3", TASKS, "Env", "is not callable"),
        (
            "def Env():\n    raise RuntimeError('no config')",
            TASKS,
            "Env",
            "building it raised .*no config",
        ),
        (GOOD.replace('name = "NAME"', 'name = "other"'), TASKS, "Env", "calls itself 'other'"),
        (
            GOOD,
            '{"id": "a", "split": "train", "prompt": "x"}\n',
            "Env",
            "no task in the 'test' split",
        ),
        (GOOD, TASKS + '{"id": "a", "split": "test", "prompt": "x"}\n', "Env", "repeats line 1"),
        (
            GOOD,
            '{"id": "a", "split": "train"}\n{"id": "b", "split": "test"}\n',
            "Env",
            "has no 'prompt'",
        ),
        (RANDOM_OPENING, TASKS, "Drifting", "reset is not deterministic"),
        (GOOD.replace("key: str", "key: tuple"), TASKS, "Env", "parameter 'key'"),
    ],
)
def test_a_broken_plugin_is_one_clear_error_naming_it(
    plugin: Callable[..., EntryPoint], source: str, tasks: str, attr: str, problem: str
) -> None:
    point = plugin(source, tasks, attr)
    with pytest.raises(BrokenEnvironmentError, match=problem) as caught:
        plugins.load(point)
    assert point.value in str(caught.value)


class _Episode:
    def __init__(self, tools: list[object]) -> None:
        self.system_prompt = ""
        self.tools = tools
        self.messages: list[object] = []

    def step(self, assistant: object) -> None: ...

    def score(self) -> None: ...


class _Env:
    name = "raw"

    def __init__(self, tools: list[object]) -> None:
        self._tools = tools

    def tasks(self) -> list[object]:
        from shared.envs.protocol import TaskSpec

        return [TaskSpec(id="a", kind="k", split="train"), TaskSpec(id="b", kind="k", split="test")]

    def reset(self, task: object, seed: int) -> _Episode:
        return _Episode(self._tools)


def _fn(name: str, parameters: object = None) -> dict[str, object]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": parameters or {"type": "object"}},
    }


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ([{"name": "x"}], 'a tool schema is {"type": "function"'),
        ([_fn("has space")], "function name 'has space' must match"),
        ([_fn("a"), _fn("a")], "two tools are named 'a'"),
        ([_fn("a", {"type": "string"})], "parameters must be a JSON schema of type object"),
        (
            [_fn("a", {"type": "object", "properties": {"x": {"type": "nonsense"}}})],
            "not a valid JSON schema",
        ),
    ],
)
def test_tool_schemas_are_checked_on_any_environment(tools: list[object], problem: str) -> None:
    with pytest.raises(BrokenEnvironmentError, match=problem):
        conformance.check(_Env(tools), "a test")  # type: ignore[arg-type]


async def test_the_full_check_runs_an_async_reset() -> None:
    class Async(_Env):
        async def areset(self, task: object, seed: int) -> _Episode:
            return _Episode([_fn("a"), _fn("a")])

    env = Async([])
    conformance.check(env, "a test")  # type: ignore[arg-type]  # the sync check cannot reset it
    with pytest.raises(BrokenEnvironmentError, match="two tools are named 'a'"):
        await conformance.acheck(env, "a test")  # type: ignore[arg-type]


def test_the_example_plugin_is_installed_and_listed() -> None:
    listed = available()
    assert listed["toolbox"] == "built in"
    assert "retrace-hotel-desk" in listed["hotel-desk"]
    assert get_environment("hotel-desk").name == "hotel-desk"


def test_an_unknown_name_lists_what_exists() -> None:
    with pytest.raises(UnknownEnvironmentError, match=r"installed: .*hotel-desk"):
        get_environment("no-such-env")


def test_a_plugin_name_must_be_a_usable_reference(plugin: Callable[..., EntryPoint]) -> None:
    with pytest.raises(BrokenEnvironmentError, match="the name must match"):
        plugins.load(plugin(name="Hotel Desk"))
