"""Derived environments for remote targets: openings snapshotted once, tool results simulated
from the seed, the reward the capability check alone, and every score saying so."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.envs.derived.build import derived_spec
from shared.envs.derived.env import DerivedEnvironment
from shared.envs.derived.simulated import SIMULATED_NOTE, is_remote, simulate
from shared.envs.derived.spec import DerivedSpec, SimulatedTask, decode_derived
from shared.envs.loading import _build
from shared.envs.protocol import Message, Score, StepResult, TaskSpec, ToolCall, ToolCallFunction
from shared.envs.synthetic.spec import InvalidSpecError
from shared.errors import PermanentError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_room",
            "description": "Book a room.",
            "parameters": {
                "type": "object",
                "properties": {"room": {"type": "string"}, "nights": {"type": "integer"}},
                "required": ["room", "nights"],
                "additionalProperties": False,
            },
        },
    }
]


class RemoteEpisode:
    def __init__(self, task: TaskSpec, closed: list[str]) -> None:
        self.system_prompt = "You are the front desk."
        self.tools = TOOLS
        self.messages = [Message(role="user", content=f"please handle {task.id}")]
        self._closed = closed
        self._task = task

    async def astep(self, assistant: Message) -> StepResult:
        raise AssertionError("a simulated replay never steps the target")

    async def ascore(self) -> Score:
        raise AssertionError("a simulated replay never asks the target for a score")

    async def aclose(self) -> None:
        self._closed.append(self._task.id)


class RemoteTarget:
    """An environment that starts its episodes asynchronously, as HTTP and MCP ones do."""

    name = "http://desk.example"

    def __init__(self) -> None:
        self.resets: list[tuple[str, int]] = []
        self.closed: list[str] = []
        self._tasks = [
            TaskSpec(id=f"t{i}", kind="book", split="train" if i < 6 else "test", data={})
            for i in range(8)
        ]

    def tasks(self) -> list[TaskSpec]:
        return list(self._tasks)

    def reset(self, task: TaskSpec, seed: int) -> Any:
        raise PermanentError("use areset")

    async def areset(self, task: TaskSpec, seed: int) -> RemoteEpisode:
        self.resets.append((task.id, seed))
        return RemoteEpisode(task, self.closed)


def _spec(capability: str = "valid_tool_arguments") -> DerivedSpec:
    return derived_spec(
        RemoteTarget.name, capability, "", ["t1", "t3"], [f"t{i}" for i in range(6)]
    )


def _call(arguments: str, name: str = "book_room", call_id: str = "c1") -> Message:
    return Message(
        role="assistant",
        tool_calls=[
            ToolCall(id=call_id, function=ToolCallFunction(name=name, arguments=arguments))
        ],
    )


async def _simulated(capability: str = "valid_tool_arguments") -> DerivedSpec:
    return await simulate(_spec(capability), RemoteTarget())


async def test_each_opening_is_taken_once_from_the_target_and_its_episode_closed() -> None:
    target = RemoteTarget()
    assert is_remote(target)
    spec = await simulate(_spec(), target)
    assert target.resets == [("t1", 0), ("t3", 0)] and target.closed == ["t1", "t3"]
    assert spec.simulated is not None and [t.task_id for t in spec.simulated] == ["t1", "t3"]
    assert spec.simulated[0].tools == TOOLS and spec.simulated[0].kind == "book"
    assert spec.simulated[0].messages[0].content == "please handle t1"
    assert spec.check_weight == 1.0  # the target's own reward needs its real tools


async def test_the_spec_round_trips_and_loads_without_its_target() -> None:
    spec = await _simulated()
    raw = msgspec.json.encode(spec)
    assert decode_derived(raw) == spec
    env = _build(raw)  # the target's URL is never opened: nothing listens there
    assert isinstance(env, DerivedEnvironment) and env.target is None
    tasks = env.tasks()
    assert len(tasks) == spec.seeds * 2
    assert {t.split for t in tasks} == {"train", "test"}


async def test_valid_calls_get_simulated_results_and_bad_ones_the_usual_errors() -> None:
    env = DerivedEnvironment(await _simulated(), None)
    task = env.tasks()[0]
    episode = env.reset(task, 3)
    assert episode.tools == TOOLS and episode.system_prompt == "You are the front desk."
    ok = episode.step(_call(json.dumps({"room": "303", "nights": 2})))
    answer = json.loads(ok.messages[0].content or "")
    assert answer["status"] == "ok" and answer["simulated"] is True
    assert answer["arguments"] == {"room": "303", "nights": 2}
    bad = episode.step(_call(json.dumps({"room": 303}), call_id="c2"))
    assert "invalid arguments" in (bad.messages[0].content or "")
    unknown = episode.step(_call("{}", name="cancel", call_id="c3"))
    assert "unknown tool" in (unknown.messages[0].content or "")
    done = episode.step(Message(role="assistant", content="Booked."))
    assert done.done
    score = episode.score()
    assert score.reward == pytest.approx(1 / 3)  # one of three calls was valid
    assert score.breakdown == {"capability:valid_tool_arguments": pytest.approx(1 / 3)}
    assert SIMULATED_NOTE in score.notes and not score.success


async def test_the_same_seed_gives_the_same_results_another_seed_another() -> None:
    env = DerivedEnvironment(await _simulated(), None)
    task = env.tasks()[0]

    def reference(seed: int) -> str:
        episode = env.reset(task, seed)
        reply = episode.step(_call(json.dumps({"room": "1", "nights": 1})))
        return str(json.loads(reply.messages[0].content or "")["reference"])

    assert reference(5) == reference(5)
    assert len({reference(s) for s in range(20)}) > 1


async def test_recovery_episodes_refuse_a_first_call_for_some_seeds_only() -> None:
    env = DerivedEnvironment(await _simulated("recover_from_tool_errors"), None)
    task = env.tasks()[0]
    refused = 0
    for seed in range(40):
        episode = env.reset(task, seed)
        first = episode.step(_call(json.dumps({"room": "1", "nights": 1})))
        if "temporarily unavailable" in (first.messages[0].content or ""):
            refused += 1
            again = episode.step(_call(json.dumps({"room": "1", "nights": 1}), call_id="c2"))
            assert json.loads(again.messages[0].content or "")["status"] == "ok"
            assert episode.score().reward == 1.0  # the refusal was followed by a success
    assert 5 < refused < 35


async def test_a_capability_without_a_check_cannot_be_simulated() -> None:
    spec = derived_spec(RemoteTarget.name, "be_polite", "Be polite.", ["t1"], ["t1"])
    assert spec.check is None
    with pytest.raises(PermanentError, match="be_polite"):
        await simulate(spec, RemoteTarget())
    forged = msgspec.structs.replace(await _simulated(), check=None)
    with pytest.raises(InvalidSpecError, match="check"):
        decode_derived(msgspec.json.encode(forged))


def test_a_remote_target_without_snapshots_is_refused_with_the_way_out() -> None:
    with pytest.raises(InvalidSpecError, match="snapshots"):
        DerivedEnvironment(_spec(), RemoteTarget())  # type: ignore[arg-type]


SNAPSHOTTED = msgspec.structs.replace(
    _spec(),
    check_weight=1.0,
    simulated=[
        SimulatedTask(
            task_id=t,
            kind="book",
            system_prompt="desk",
            tools=TOOLS,
            messages=[Message(role="user", content=t)],
        )
        for t in ("t1", "t3")
    ],
)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_nothing_an_agent_sends_raises(arguments: str) -> None:
    env = DerivedEnvironment(SNAPSHOTTED, None)
    episode = env.reset(env.tasks()[0], 0)
    result = episode.step(_call(arguments))
    assert result.messages[0].role == "tool"
    assert 0.0 <= episode.score().reward <= 1.0
