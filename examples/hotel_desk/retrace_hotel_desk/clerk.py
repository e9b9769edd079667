"""A scripted front-desk clerk that solves any hotel-desk task with the real tools: it writes
each task's reference solution (make_tasks.py) and shows in tests that every task is solvable
at every seed."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from retrace_hotel_desk.env import HotelDesk
from shared.envs.kit import KitEpisode, Message, TaskSpec
from shared.envs.protocol import ToolCall, ToolCallFunction


class _Clerk:
    def __init__(self, episode: KitEpisode[Any]) -> None:
        self.episode = episode
        self.said: list[Message] = []

    def act(self, name: str, **arguments: Any) -> Any:
        call = ToolCall(
            id=f"call_{len(self.said) + 1}",
            function=ToolCallFunction(name=name, arguments=json.dumps(arguments)),
        )
        self.said.append(Message(role="assistant", tool_calls=[call]))
        answer = json.loads(self.episode.step(self.said[-1]).messages[0].content or "null")
        if isinstance(answer, dict) and "error" in answer:
            raise AssertionError(f"{name} refused: {answer['error']}")
        return answer

    def tell(self, text: str) -> None:
        self.said.append(Message(role="assistant", content=text))
        self.episode.step(self.said[-1])


def solve(env: HotelDesk, task: TaskSpec, seed: int) -> list[dict[str, Any]]:
    """The clerk's side of a solved episode of `task` at `seed`, as plain data."""
    clerk = _Clerk(env.reset(task, seed))
    data = task.data
    if task.kind == "book":
        if data.get("replies"):
            clerk.tell("Of course. How many nights will you stay?")
        query = {"check_in": data["check_in"], "nights": data["nights"], "kind": data["room_kind"]}
        if data["accessible"]:
            query["accessible"] = True
        room = clerk.act("search_rooms", **query)[0]
        booked = clerk.act(
            "book_room",
            guest=data["guest"],
            room_id=room["room_id"],
            check_in=data["check_in"],
            nights=data["nights"],
        )
        clerk.tell(
            f"Done: room {room['room_id']} is booked for you, reservation "
            f"{booked['reservation_id']}, {data['nights']} night(s) from {data['check_in']}."
        )
    else:
        stays = clerk.act("find_reservations", guest=data["guest"])
        stay = stays[data.get("target", 0)]
        rid = stay["reservation_id"]
        if task.kind == "cancel":
            clerk.act("cancel_reservation", reservation_id=rid)
            clerk.tell(f"Your reservation {rid} from {stay['check_in']} is cancelled.")
        elif task.kind == "change":
            clerk.act(
                "change_dates",
                reservation_id=rid,
                check_in=data["new_check_in"],
                nights=data["new_nights"],
            )
            clerk.tell(
                f"Your stay {rid} now starts on {data['new_check_in']} for "
                f"{data['new_nights']} night(s), same room."
            )
        else:
            total = clerk.act("get_bill", reservation_id=rid)["total"]
            clerk.tell(f"Your stay comes to {total:.2f} EUR in total, tax included.")
    score = clerk.episode.score()
    if not score.success:
        raise AssertionError(f"task {task.id} seed {seed}: the clerk scored {score}")
    return [msgspec.to_builtins(m) for m in clerk.said]
