"""The worked plug-in example, examples/hotel_desk (installed by the test command): every task
is solvable at every seed, its stored reference earns full reward, and the reward gives partial
credit for partial work and none for claims without action."""

from __future__ import annotations

import json
from typing import Any

import pytest
from retrace_hotel_desk.clerk import solve
from retrace_hotel_desk.env import HotelDesk

from shared.envs.protocol import Message, ToolCall, ToolCallFunction
from shared.envs.reference import replay
from shared.envs.registry import get_environment


@pytest.fixture(scope="module")
def env() -> HotelDesk:
    loaded = get_environment("hotel-desk")
    assert isinstance(loaded, HotelDesk)
    return loaded


def _call(name: str, **arguments: Any) -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id="c", function=function)])


def _say(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_every_stored_reference_earns_full_reward(env: HotelDesk) -> None:
    for task in env.tasks():
        replayed = replay(env, task)
        assert replayed is not None and replayed.score.success, task.id


@pytest.mark.parametrize("seed", [1, 2, 3, 17])
def test_every_task_is_solvable_at_other_seeds(env: HotelDesk, seed: int) -> None:
    for task in env.tasks():
        assert solve(env, task, seed)  # raises when a tool refuses or the reward is short


def test_seeds_change_the_world(env: HotelDesk) -> None:
    task = next(t for t in env.tasks() if t.kind == "book")
    worlds = {
        tuple(
            sorted((r.room_id, r.check_in) for r in env.reset(task, s).state.reservations.values())
        )
        for s in range(6)
    }
    assert len(worlds) > 1


def _book_task(env: HotelDesk) -> Any:
    for task in env.tasks():
        if task.kind != "book" or task.data.get("replies"):
            continue
        episode = env.reset(task, 0)
        query = {"check_in": task.data["check_in"], "nights": task.data["nights"]}
        rooms = episode.box.tools["search_rooms"].fn(kind=task.data["room_kind"], **query)
        rooms = [r for r in rooms if r["accessible"] or not task.data["accessible"]]
        if len(rooms) > 1:
            return task, rooms
    raise AssertionError("no book task with two fitting rooms free at seed 0")


def test_booking_a_pricier_room_earns_partial_credit_and_two_rooms_halve_it(
    env: HotelDesk,
) -> None:
    task, rooms = _book_task(env)
    args = {
        "guest": task.data["guest"],
        "check_in": task.data["check_in"],
        "nights": task.data["nights"],
    }
    episode = env.reset(task, 0)
    episode.step(_call("book_room", room_id=rooms[-1]["room_id"], **args))
    assert episode.score().reward == pytest.approx(0.6)
    episode.step(_call("book_room", room_id=rooms[0]["room_id"], **args))
    assert episode.score().reward == pytest.approx(0.5)


def test_a_total_said_without_looking_it_up_earns_nothing(env: HotelDesk) -> None:
    task = next(t for t in env.tasks() if t.kind == "bill")
    solved = env.reset(task, 0)
    total = solved.state.expected["total"]
    guessing = env.reset(task, 0)
    guessing.step(_say(f"It will be {total:.2f} EUR."))
    assert guessing.score().reward == 0.0


def test_cancelling_the_other_stay_too_earns_nothing(env: HotelDesk) -> None:
    task = next(t for t in env.tasks() if t.kind == "cancel" and len(t.data["existing"]) == 2)
    episode = env.reset(task, 0)
    for reservation_id in list(episode.state.reservations):
        if episode.state.reservations[reservation_id].guest == task.data["guest"]:
            episode.step(_call("cancel_reservation", reservation_id=reservation_id))
    assert episode.score().reward == 0.0


def test_bad_calls_come_back_as_tool_errors(env: HotelDesk) -> None:
    episode = env.reset(env.tasks()[0], 0)
    [answer] = episode.step(
        _call("book_room", guest="A", room_id="101", check_in="soon", nights=1)
    ).messages
    assert "not a date" in (answer.content or "")
    [answer] = episode.step(_call("get_bill", reservation_id="R1")).messages
    assert "no reservation 'R1'" in (answer.content or "")
    assert [c.ok for c in episode.calls] == [False, False]
