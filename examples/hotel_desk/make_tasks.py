"""Writes retrace_hotel_desk/tasks.jsonl: the environment's tasks, drawn once from a fixed seed
(run it again and the file is the same). 48 tasks, a quarter of each kind held out as `test`.

Each task also carries its `reference`: the assistant's side of a solved episode at seed 0,
found by a scripted front-desk clerk playing the real tools and checked to earn reward 1.
retrace replays references as the successful examples its diagnosis contrasts failures with.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

GUESTS = (
    "Ana Ruiz",
    "Bruno Costa",
    "Chloe Martin",
    "David Okafor",
    "Elif Yilmaz",
    "Farah Aziz",
    "Goran Petrov",
    "Hana Sato",
    "Ivan Horvat",
    "Julia Weber",
    "Karim Mansour",
    "Laura Rossi",
    "Marco Bianchi",
    "Nadia Kowalski",
    "Oscar Lindqvist",
    "Priya Nair",
)
KINDS = ("single", "double", "suite")
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
START = dt.date(2026, 12, 3)


def day(rng: random.Random) -> str:
    return (START + dt.timedelta(days=rng.randint(0, 24))).isoformat()


def book(rng: random.Random, guest: str, n: int) -> dict[str, Any]:
    kind = rng.choice(KINDS)
    nights = rng.randint(1, 4)
    accessible = rng.random() < 0.3
    check_in = day(rng)
    need = " wheelchair-accessible" if accessible else ""
    task: dict[str, Any] = {
        "kind": "book",
        "guest": guest,
        "check_in": check_in,
        "nights": nights,
        "room_kind": kind,
        "accessible": accessible,
    }
    if n % 3 == 2:  # the guest leaves the length of the stay out until asked
        task["prompt"] = f"Hello, this is {guest}. I'd like a{need} {kind} room from {check_in}."
        task["replies"] = [f"{NUMBERS[nights].capitalize()} night{'s' * (nights > 1)}, please."]
    else:
        task["prompt"] = rng.choice(
            (
                f"Hi, I'm {guest}. Please book me the cheapest{need} {kind} room for "
                f"{NUMBERS[nights]} night{'s' * (nights > 1)} from {check_in}.",
                f"{guest} here: I need a{need} {kind} room, check-in {check_in}, "
                f"{nights} night{'s' * (nights > 1)}. Whatever is cheapest.",
            )
        )
    return task


def stay(rng: random.Random) -> list[Any]:
    return [rng.choice(("101", "103", "104", "202", "204", "302")), day(rng), rng.randint(1, 4)]


def cancel(rng: random.Random, guest: str, n: int) -> dict[str, Any]:
    stays = [stay(rng)]
    if n % 2:  # two stays: the guest names the one to cancel by its date
        other = stay(rng)
        while other[1] == stays[0][1] or other[0] == stays[0][0]:
            other = stay(rng)
        stays.append(other)
    target = rng.randrange(len(stays))
    prompt = f"Hi, {guest} here. Please cancel my reservation"
    prompt += f" that starts on {stays[target][1]}." if len(stays) > 1 else "."
    return {"kind": "cancel", "guest": guest, "existing": stays, "target": target, "prompt": prompt}


def change(rng: random.Random, guest: str, n: int) -> dict[str, Any]:
    room, check_in, nights = stay(rng)
    new = dt.date.fromisoformat(check_in) + dt.timedelta(days=rng.choice((-1, 1, 2, 3, 7)))
    new = max(new, START)
    new_nights = rng.choice((nights, nights + 1, max(1, nights - 1)))
    return {
        "kind": "change",
        "guest": guest,
        "existing": [[room, check_in, nights]],
        "new_check_in": new.isoformat(),
        "new_nights": new_nights,
        "prompt": (
            f"This is {guest}. Could you move my stay to arrive on {new.isoformat()} "
            f"and stay {NUMBERS.get(new_nights, str(new_nights))} night{'s' * (new_nights > 1)}? "
            "Same room is fine."
        ),
    }


def ask_bill(rng: random.Random, guest: str, n: int) -> dict[str, Any]:
    return {
        "kind": "bill",
        "guest": guest,
        "existing": [stay(rng)],
        "prompt": rng.choice(
            (
                f"Hi, I'm {guest}. How much will my stay cost in total, tax included?",
                f"{guest} here. What is the total I'll pay for my reservation?",
            )
        ),
    }


def main() -> None:
    rng = random.Random(20261201)
    rows = []
    for make in (book, cancel, change, ask_bill):
        for n in range(12):
            task = make(rng, rng.choice(GUESTS), n)
            split = "test" if n % 4 == 3 else "train"
            rows.append(
                {
                    "id": f"{task.pop('kind')}-{n:02d}",
                    "split": split,
                    "kind": make.__name__.replace("ask_", ""),
                    **task,
                }
            )
    out = Path(__file__).parent / "retrace_hotel_desk" / "tasks.jsonl"
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    references = solve_all()
    for row in rows:
        row["reference"] = references[row["id"]]
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} tasks to {out}")


def solve_all() -> dict[str, list[dict[str, Any]]]:
    from retrace_hotel_desk.clerk import solve
    from retrace_hotel_desk.env import HotelDesk

    env = HotelDesk()
    return {task.id: solve(env, task, 0) for task in env.tasks()}
