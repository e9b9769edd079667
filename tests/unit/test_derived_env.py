"""Derived training environments for plug-in targets (shared/envs/derived): the target's own
tasks in fresh seeded worlds, its tools untouched, its reward blended with a capability check."""

from __future__ import annotations

import json

import msgspec
import pytest
from retrace_hotel_desk.env import HotelDesk

from shared.envs.derived.build import adjust_derived, derived_spec
from shared.envs.derived.checks import asked_first, recovered, valid_arguments
from shared.envs.derived.env import DerivedEnvironment
from shared.envs.derived.spec import DerivedSpec, decode_derived, is_derived
from shared.envs.loading import _build
from shared.envs.protocol import Message, ToolCall, ToolCallFunction
from shared.envs.reference import reference_of
from shared.envs.synthetic.spec import InvalidSpecError
from shared.envs.tools import CallRecord

DESK = HotelDesk()
TRAIN = [t.id for t in DESK.tasks() if t.split == "train"]


def _spec(**changes: object) -> DerivedSpec:
    spec = derived_spec(
        "hotel-desk", "valid_tool_arguments", "Tool arguments match the schema.",
        ["book-01", "cancel-02", "not-a-train-task"], TRAIN,
    )  # fmt: skip
    return msgspec.structs.replace(spec, **changes)  # type: ignore[arg-type]


def test_the_spec_replays_the_failed_train_tasks_with_the_capability_check() -> None:
    spec = _spec()
    assert spec.task_ids == ["book-01", "cancel-02"] and spec.check == "valid_tool_arguments"
    assert spec.name == "valid_tool_arguments-on-hotel-desk" and spec.hints
    fallback = derived_spec("hotel-desk", "some_new_skill", "Do it well.", [], TRAIN)
    assert fallback.task_ids == TRAIN[:8] and fallback.check is None
    assert "Do it well." in fallback.hints[0]


def test_tasks_are_seeded_worlds_of_the_target_tasks_with_held_out_worlds() -> None:
    env = DerivedEnvironment(_spec(), DESK)
    tasks = env.tasks()
    assert len(tasks) == 8 * 2
    assert sum(t.split == "test" for t in tasks) == 2 * 2
    assert {t.data["world"] for t in tasks if t.split == "test"} == {6, 7}
    assert all(t.data["hint"] for t in tasks)
    first, other = (env.reset(t, 0) for t in tasks[:4:2])  # book-01 in worlds 0 and 1
    assert first.tools == DESK.reset(DESK.tasks()[1], 0).tools
    assert first.messages == other.messages
    worlds = {
        tuple(sorted(env.reset(t, 0).inner.state.reservations))  # type: ignore[attr-defined]
        for t in tasks
        if t.data["target_task"] == "book-01"
    }
    assert len(worlds) > 1


def test_the_grade_blends_the_target_reward_and_the_check() -> None:
    env = DerivedEnvironment(_spec(check_weight=0.5), DESK)
    task = env.tasks()[0]
    target_task = next(t for t in DESK.tasks() if t.id == task.data["target_task"])
    episode = env.reset(task, 0)
    bad = ToolCall(id="x", function=ToolCallFunction(name="book_room", arguments='{"room": 1}'))
    episode.step(Message(role="assistant", tool_calls=[bad]))
    score = episode.score()
    assert score.reward == 0.0 and score.breakdown["capability:valid_tool_arguments"] == 0.0
    solved = env.reset(task, 0)
    # the reference was found at seed 0 of the target; world 0 seed 0 is that same world
    for message in reference_of(target_task) or []:
        if solved.step(message).done:
            break
    graded = solved.score()
    assert graded.success and graded.reward == pytest.approx(1.0)


def test_the_stored_spec_rebuilds_the_environment() -> None:
    raw = msgspec.json.encode(_spec())
    assert is_derived(json.loads(raw))
    env = _build(raw)
    assert isinstance(env, DerivedEnvironment) and env.name.startswith("synthetic/")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"task_ids": []}, "no target task"),
        ({"test_seeds": 8}, "test_seeds"),
        ({"check_weight": 2.0}, "check_weight"),
    ],
)
def test_a_bad_stored_spec_is_refused(changes: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidSpecError, match=problem):
        decode_derived(msgspec.json.encode(_spec(**changes)))


def test_unknown_tasks_and_checks_are_refused() -> None:
    with pytest.raises(InvalidSpecError, match="no task 'nope'"):
        DerivedEnvironment(_spec(task_ids=["nope"]), DESK)
    with pytest.raises(InvalidSpecError, match="unknown check"):
        DerivedEnvironment(_spec(check="telepathy"), DESK)


def test_adjusting_moves_hints_first_then_the_check_weight() -> None:
    spec = _spec(hint_share=0.0, check_weight=0.5)
    easier = adjust_derived(spec, too_hard=True, max_hint_share=0.5)
    assert easier is not None
    assert (easier.hint_share, easier.check_weight, easier.revision) == (0.25, 0.5, 1)
    easiest = adjust_derived(_spec(hint_share=0.5), too_hard=True, max_hint_share=0.5)
    assert easiest is not None and easiest.check_weight == pytest.approx(0.65)
    harder = adjust_derived(_spec(hint_share=0.0), too_hard=False, max_hint_share=0.5)
    assert harder is not None and harder.check_weight == pytest.approx(0.35)
    # nothing left to move: calibration stops instead of judging the same environment again
    unchecked = _spec(check=None, hint_share=0.5)
    assert adjust_derived(unchecked, too_hard=True, max_hint_share=0.5) is None
    assert adjust_derived(_spec(check_weight=0.8, hint_share=0.5), True, 0.5) is None


def _rec(ok: bool, error: str | None = None) -> CallRecord:
    return CallRecord("t", {}, ok, error)


def test_the_capability_checks() -> None:
    assert valid_arguments([], [_rec(True), _rec(False, "invalid arguments: x")]) == 0.5
    assert (
        valid_arguments([], [_rec(False, "room 1 is not free")]) == 1.0
    )  # a refusal, not a bad call
    assert recovered([], [_rec(False, "no"), _rec(True)]) == 1.0
    assert recovered([], [_rec(True), _rec(False, "no")]) == 0.0
    ask = Message(role="assistant", content="How many nights?")
    act = Message(
        role="assistant",
        tool_calls=[ToolCall(id="c", function=ToolCallFunction(name="t", arguments="{}"))],
    )
    assert asked_first([ask, act], []) == 1.0 and asked_first([act, ask], []) == 0.0
