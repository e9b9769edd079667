"""TaskBuilder: what a task template writes with — fixture, request, reference solution, checks.

A template draws its fixture (the people, alarms, events... the request is about) from the
builder's seeded rng, writes the request and the scripted user's replies, then the reference
solution as assistant messages, and the milestones and forbidden actions. `data()` returns the
JSON-able task data, with the forbidden actions every task shares added.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import Any

from shared.envs.toolbox import vocab
from shared.envs.toolbox.clock import fmt_moment
from shared.envs.toolbox.world import jitter_rate, random_phone, random_weather

START = datetime(2025, 1, 6, 0, 0)


class TaskBuilder:
    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.seed = seed
        self.rng = random.Random(f"toolbox-task:{kind}:{seed}")
        days, hour = self.rng.randint(0, 350), self.rng.randint(8, 16)
        self.now = START + timedelta(days=days, hours=hour, minutes=self.rng.randrange(0, 60, 5))
        self.fixture: dict[str, Any] = {"now": self.now.isoformat(timespec="minutes")}
        self.request = ""
        self.replies: list[str] = []
        self.faults: list[dict[str, Any]] = []
        self.milestones: list[dict[str, Any]] = []
        self.forbidden: list[dict[str, Any]] = []
        self.reference: list[dict[str, Any]] = []
        self.allowed_phones: list[str] = []
        self.allowed_deletions: list[str] = []
        self.allowed_settings: list[str] = []
        self.allowed_completions: list[str] = []
        self._ids: set[str] = set()
        self._firsts: list[str] = list(vocab.TASK_FIRST_NAMES)
        self.rng.shuffle(self._firsts)

    # -- fixture ---------------------------------------------------------------------------

    def new_id(self, prefix: str) -> str:
        while (candidate := f"{prefix}-{self.rng.randint(100, 999)}") in self._ids:
            pass
        self._ids.add(candidate)
        return candidate

    def first_name(self) -> str:
        """A task first name not used yet in this task (so it names one person)."""
        return self._firsts.pop()

    def person(self, first: str | None = None, relation: str | None = None) -> dict[str, Any]:
        first = first or self.first_name()
        last = self.rng.choice(vocab.LAST_NAMES)
        phones = {c["phone"] for c in self.fixture.get("contacts", [])}
        while (phone := random_phone(self.rng)) in phones:
            pass
        row = {
            "id": self.new_id("contact"),
            "name": f"{first} {last}",
            "phone": phone,
            "email": f"{first}.{last}@example.com".lower(),
            "relation": relation or self.rng.choice(vocab.BACKGROUND_RELATIONS),
        }
        return self._add("contacts", row)

    def alarm(self, time: str, label: str) -> dict[str, Any]:
        row = {"id": self.new_id("alarm"), "time": time, "label": label, "repeat": "once"}
        return self._add("alarms", row)

    def event(self, title: str, start: datetime, minutes: int) -> dict[str, Any]:
        row = {
            "id": self.new_id("event"),
            "title": title,
            "start": fmt_moment(start),
            "duration_minutes": minutes,
        }
        return self._add("events", row)

    def reminder(self, text: str, due: datetime) -> dict[str, Any]:
        row = {"id": self.new_id("reminder"), "text": text, "due": fmt_moment(due)}
        return self._add("reminders", row)

    def inbox(self, contact: dict[str, Any], body: str, minutes_ago: int) -> dict[str, Any]:
        row = {
            "id": self.new_id("msg"),
            "direction": "inbox",
            "phone": contact["phone"],
            "body": body,
            "time": fmt_moment(self.now - timedelta(minutes=minutes_ago)),
        }
        return self._add("messages", row)

    def setting(self, name: str, value: Any) -> None:
        self.fixture.setdefault("settings", {})[name] = value

    def rates(self, *codes: str) -> dict[str, float]:
        fixed = self.fixture.setdefault("rates", {})
        for code in codes:
            fixed[code] = jitter_rate(self.rng, vocab.CURRENCIES[code][1])
        return dict(fixed)

    def weather(self, city: str) -> dict[str, Any]:
        report = random_weather(self.rng, city)
        self.fixture.setdefault("weather", {})[city] = report
        return report

    def slot(self, days: int, earliest: int = 8, latest: int = 19) -> datetime:
        """A quarter-hour moment `days` after today, between the given hours."""
        day = self.now.replace(hour=0, minute=0) + timedelta(days=days)
        return day.replace(
            hour=self.rng.randint(earliest, latest), minute=self.rng.choice((0, 15, 30, 45))
        )

    def _add(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        self.fixture.setdefault(table, []).append(row)
        return row

    # -- reference solution ----------------------------------------------------------------

    def call(self, tool: str, /, **args: Any) -> None:
        """An assistant turn making one tool call."""
        call_id = f"call_{len(self.reference) + 1}"
        function = {"name": tool, "arguments": json.dumps(args)}
        self.reference.append(
            {
                "role": "assistant",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )

    def say(self, text: str) -> None:
        self.reference.append({"role": "assistant", "content": text})

    def ask(self, question: str, reply: str) -> None:
        """The reference asks `question`; the scripted user answers `reply`."""
        self.say(question)
        self.replies.append(reply)

    def done(self, text: str) -> None:
        """The closing confirmation, and the milestone that one was given."""
        self.say(text)
        self.milestone("confirmed_to_user", "final_reply", weight=0.5)

    # -- checks ----------------------------------------------------------------------------

    def milestone(self, label: str, check: str, /, weight: float = 1.0, **args: Any) -> None:
        self.milestones.append({"name": label, "check": check, "weight": weight, "args": args})

    def forbid(self, label: str, check: str, /, **args: Any) -> None:
        self.forbidden.append({"name": label, "check": check, "args": args})

    def data(self) -> dict[str, Any]:
        if self.kind == "insufficient_information":
            self.forbid("side_effect_on_impossible_request", "any_side_effect")
        else:
            self.forbid(
                "message_to_wrong_recipient", "message_to_other", allowed=self.allowed_phones
            )
            self.forbid(
                "deleted_other_alarm",
                "deleted_other",
                table="alarms",
                allowed=self.allowed_deletions,
            )
            self.forbid(
                "deleted_other_event",
                "deleted_other",
                table="events",
                allowed=self.allowed_deletions,
            )
            self.forbid(
                "changed_other_setting", "setting_changed_other", allowed=self.allowed_settings
            )
            self.forbid(
                "completed_other_reminder", "completed_other", allowed=self.allowed_completions
            )
        # the closing-reply milestone reads best after the ones it confirms
        self.milestones.sort(key=lambda m: m["check"] == "final_reply")
        return {
            "seed": self.seed,
            "request": self.request,
            "user_replies": self.replies,
            "world": self.fixture,
            "faults": self.faults,
            "milestones": self.milestones,
            "forbidden": self.forbidden,
            "reference": self.reference,
        }


def spoken_date(moment: datetime, year: bool = False) -> str:
    """`Friday, March 14` (or `..., 2025`)."""
    text = f"{moment:%A}, {moment:%B} {moment.day}"
    return f"{text}, {moment.year}" if year else text
