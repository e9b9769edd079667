"""`hotel-desk`: a hotel's front desk. Guests book the cheapest room that fits, cancel or move a
stay, and ask what they owe; the reward reads the hotel's final reservations and the reply."""

from __future__ import annotations

import datetime as dt
import random
import re
from pathlib import Path
from typing import Any

from retrace_hotel_desk.hotel import TOOLS, Hotel, Reservation, bill
from shared.envs.kit import Score, TaskFileEnvironment, TaskSpec, Transcript

TODAY = dt.date(2026, 12, 1)
OTHER_GUESTS = ("Kai Berg", "Lena Novak", "Omar Haddad", "Ines Duarte", "Tom Reilly", "Mei Lin")
BUSY = 0.45
"""Share of the other rooms another guest holds around the task's dates."""
_AMOUNT = re.compile(r"\d[\d,]*(?:\.\d+)?")


class HotelDesk(TaskFileEnvironment[Hotel]):
    name = "hotel-desk"
    task_file = Path(__file__).with_name("tasks.jsonl")
    system_prompt = (
        "You are the front desk assistant of Hotel Miramar. Today is 2026-12-01. "
        "Use the tools to check availability and reservations before you act, and never "
        "invent a room, a reservation id or a price. Do exactly what the guest asks: book the "
        "cheapest room that meets their needs unless they say otherwise, and change or cancel "
        "only the stay they mean. Then tell the guest in one or two sentences what you did."
    )
    tools = TOOLS

    def initial_state(self, task: TaskSpec, rng: random.Random) -> Hotel:
        hotel = Hotel(today=TODAY, next_number=rng.randrange(4100, 8900))
        data = task.data
        planted = [
            hotel.add(data["guest"], room, dt.date.fromisoformat(day), nights)
            for room, day, nights in data.get("existing", [])
        ]
        focus = dt.date.fromisoformat(
            data.get("check_in") or data.get("new_check_in") or planted[0].check_in.isoformat()
        )
        keep_free = {planted[0].room_id} if task.kind == "change" else set()
        for room in hotel.rooms.values():
            if room.id in keep_free or rng.random() >= BUSY:
                continue
            start = max(TODAY, focus + dt.timedelta(days=rng.randint(-2, 2)))
            nights = rng.randint(1, 4)
            if hotel.free(room.id, start, nights):
                hotel.add(rng.choice(OTHER_GUESTS), room.id, start, nights)
        if task.kind == "book":
            _leave_one_free(hotel, task, rng)
        hotel.expected = _expected(hotel, task, planted)
        return hotel

    def reward(self, task: TaskSpec, transcript: Transcript[Hotel]) -> Score:
        hotel, expected = transcript.state, transcript.state.expected
        mine = [r for r in hotel.reservations.values() if _same(r.guest, task.data["guest"])]
        new = [r for r in mine if r.id not in expected["planted"] and r.status == "booked"]
        if task.kind == "book":
            parts = _book(task, hotel, new, expected)
        elif task.kind == "cancel":
            parts = _cancel(hotel, expected)
        elif task.kind == "change":
            parts = _change(task, hotel, expected)
        else:
            parts = _bill(transcript, expected)
        if task.kind != "book" and new:
            parts["extra_bookings"] = -0.5
        reward = max(0.0, min(1.0, sum(parts.values())))
        if task.kind == "book" and len(new) > 1:
            parts["extra_bookings"] = -reward / 2
            reward /= 2
        notes = [f"{k}: {v:+.2f}" for k, v in parts.items()]
        return Score(reward=round(reward, 4), success=reward >= 1.0, breakdown=parts, notes=notes)


def _leave_one_free(hotel: Hotel, task: TaskSpec, rng: random.Random) -> None:
    """Other guests never take every room the task could be solved with."""
    check_in = dt.date.fromisoformat(task.data["check_in"])
    nights = task.data["nights"]
    fitting = [r for r in hotel.rooms.values() if _fits(r.id, hotel, task)]
    if any(hotel.free(r.id, check_in, nights) for r in fitting):
        return
    room = rng.choice(fitting)
    for reservation in list(hotel.reservations.values()):
        if reservation.room_id == room.id and reservation.overlaps(check_in, nights):
            del hotel.reservations[reservation.id]


def _fits(room_id: str, hotel: Hotel, task: TaskSpec) -> bool:
    room = hotel.rooms[room_id]
    return room.kind == task.data["room_kind"] and (
        not task.data.get("accessible") or room.accessible
    )


def _expected(hotel: Hotel, task: TaskSpec, planted: list[Reservation]) -> dict[str, Any]:
    out: dict[str, Any] = {"planted": [r.id for r in planted]}
    if task.kind == "book":
        check_in = dt.date.fromisoformat(task.data["check_in"])
        free = [
            r
            for r in hotel.rooms.values()
            if _fits(r.id, hotel, task) and hotel.free(r.id, check_in, task.data["nights"])
        ]
        out["cheapest_rate"] = min(r.rate for r in free)
    elif planted:
        target = planted[task.data.get("target", 0)]
        out["target"] = target.id
        out["total"] = bill(hotel, target)["total"]
    return out


def _book(
    task: TaskSpec, hotel: Hotel, new: list[Reservation], expected: dict[str, Any]
) -> dict[str, float]:
    check_in = dt.date.fromisoformat(task.data["check_in"])
    right = [
        r
        for r in new
        if r.check_in == check_in
        and r.nights == task.data["nights"]
        and _fits(r.room_id, hotel, task)
    ]
    if not right:
        return {"booked_what_was_asked": 0.0}
    cheapest = any(hotel.rooms[r.room_id].rate == expected["cheapest_rate"] for r in right)
    return {"booked_what_was_asked": 0.6, "cheapest": 0.4 if cheapest else 0.0}


def _cancel(hotel: Hotel, expected: dict[str, Any]) -> dict[str, float]:
    target = hotel.reservations[expected["target"]]
    others = [hotel.reservations[i] for i in expected["planted"] if i != target.id]
    parts = {"cancelled_the_stay": 1.0 if target.status == "cancelled" else 0.0}
    if any(r.status == "cancelled" for r in others):
        parts["cancelled_another_stay"] = -1.0
    return parts


def _change(task: TaskSpec, hotel: Hotel, expected: dict[str, Any]) -> dict[str, float]:
    target = hotel.reservations[expected["target"]]
    if target.status != "booked":
        return {"stay_kept": 0.0}
    new_day = dt.date.fromisoformat(task.data["new_check_in"])
    return {
        "new_check_in": 0.5 if target.check_in == new_day else 0.0,
        "new_nights": 0.5
        if target.nights == task.data["new_nights"] and target.check_in == new_day
        else 0.0,
    }


def _bill(transcript: Transcript[Hotel], expected: dict[str, Any]) -> dict[str, float]:
    hotel = transcript.state
    if hotel.reservations[expected["target"]].status != "booked":
        return {"stay_kept": 0.0}
    looked_up = any(
        (c.arguments or {}).get("reservation_id", "").strip().upper() == expected["target"]
        for c in transcript.called("get_bill")
    )
    said = (
        bool(transcript.calls)
        and any(c.ok for c in transcript.calls)
        and any(
            abs(float(m.replace(",", "")) - expected["total"]) < 0.01
            for m in _AMOUNT.findall(transcript.final_reply)
        )
    )
    return {"looked_up_the_bill": 0.3 if looked_up else 0.0, "told_the_total": 0.7 if said else 0.0}


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())
