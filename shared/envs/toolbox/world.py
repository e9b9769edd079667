"""The toolbox world: a phone's contacts, messages, alarms, reminders, calendar, notes, settings,
exchange rates and weather, frozen at one "now".

`build_world(fixture, task_seed, seed)` lays seeded background filler (drawn only from the
`BACKGROUND_*` vocabulary) and then the task's fixture on top, so the entities a request talks
about are exactly the ones the task placed, and different episode seeds still give different
worlds around them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared.envs.toolbox import vocab
from shared.envs.toolbox.clock import fmt_moment


@dataclass
class Contact:
    id: str
    name: str
    phone: str
    email: str | None = None
    relation: str | None = None


@dataclass
class TextMessage:
    id: str
    direction: str
    """`inbox` (received) or `outbox` (sent)."""
    phone: str
    """The other party's number."""
    body: str
    time: str


@dataclass
class Alarm:
    id: str
    time: str
    label: str = ""
    repeat: str = "once"
    enabled: bool = True


@dataclass
class Reminder:
    id: str
    text: str
    due: str
    completed: bool = False


@dataclass
class Event:
    id: str
    title: str
    start: str
    duration_minutes: int
    attendees: list[str] = field(default_factory=list)
    location: str = ""


@dataclass
class Note:
    id: str
    title: str
    body: str


@dataclass
class World:
    now: datetime
    rng: random.Random
    """Draws ids for what the agent creates: same actions, same ids."""
    contacts: dict[str, Contact] = field(default_factory=dict)
    messages: dict[str, TextMessage] = field(default_factory=dict)
    alarms: dict[str, Alarm] = field(default_factory=dict)
    reminders: dict[str, Reminder] = field(default_factory=dict)
    events: dict[str, Event] = field(default_factory=dict)
    notes: dict[str, Note] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    """Units of each currency per 1 USD."""
    weather: dict[str, dict[str, Any]] = field(default_factory=dict)

    def new_id(self, prefix: str) -> str:
        taken = self._ids()
        # the range grows with the world, so a free id always exists however much is created
        top = max(999, 10 * len(taken))
        while (candidate := f"{prefix}-{self.rng.randint(100, top)}") in taken:
            pass
        return candidate

    def contact_by_phone(self, phone: str) -> Contact | None:
        return next((c for c in self.contacts.values() if c.phone == phone), None)

    def snapshot(self) -> dict[str, Any]:
        """Everything but the rng, as plain data (for comparing and for tests)."""
        state = asdict(self)
        state.pop("rng")
        state["now"] = fmt_moment(self.now)
        return state

    def _ids(self) -> set[str]:
        tables = (self.contacts, self.messages, self.alarms, self.reminders, self.events)
        return {key for table in (*tables, self.notes) for key in table}


def build_world(fixture: dict[str, Any], task_seed: int, seed: int) -> World:
    rng = random.Random(f"toolbox-world:{task_seed}:{seed}")
    world = World(now=datetime.fromisoformat(fixture["now"]), rng=rng)
    reserved = _fixture_ids(fixture)
    _background(world, rng, reserved)
    _apply_fixture(world, fixture)
    return world


def _fixture_ids(fixture: dict[str, Any]) -> set[str]:
    """Ids and phone numbers the background must not reuse."""
    tables = ("contacts", "messages", "alarms", "reminders", "events", "notes")
    taken = {row["id"] for table in tables for row in fixture.get(table, [])}
    return taken | {row["phone"] for row in fixture.get("contacts", [])}


def _apply_fixture(world: World, fixture: dict[str, Any]) -> None:
    for row in fixture.get("contacts", []):
        world.contacts[row["id"]] = Contact(**row)
    for row in fixture.get("messages", []):
        world.messages[row["id"]] = TextMessage(**row)
    for row in fixture.get("alarms", []):
        world.alarms[row["id"]] = Alarm(**row)
    for row in fixture.get("reminders", []):
        world.reminders[row["id"]] = Reminder(**row)
    for row in fixture.get("events", []):
        world.events[row["id"]] = Event(**row)
    for row in fixture.get("notes", []):
        world.notes[row["id"]] = Note(**row)
    world.settings.update(fixture.get("settings", {}))
    world.rates.update(fixture.get("rates", {}))
    world.weather.update(fixture.get("weather", {}))


def _background(world: World, rng: random.Random, reserved: set[str]) -> None:
    """Seeded filler: never a task name, relation, label, title or city (see vocab)."""

    def fresh(draw: Callable[[], str]) -> str:
        while (candidate := draw()) in reserved:
            pass
        reserved.add(candidate)
        return candidate

    def new_id(prefix: str) -> str:
        return fresh(lambda: f"{prefix}-{rng.randint(100, 999)}")

    firsts = rng.sample(vocab.BACKGROUND_FIRST_NAMES, rng.randint(5, 10))
    for first in firsts:
        last = rng.choice(vocab.LAST_NAMES)
        contact = Contact(
            id=new_id("contact"),
            name=f"{first} {last}",
            phone=fresh(lambda: random_phone(rng)),
            email=f"{first}.{last}@example.com".lower() if rng.random() < 0.7 else None,
            relation=rng.choice(vocab.BACKGROUND_RELATIONS),
        )
        world.contacts[contact.id] = contact
    people = list(world.contacts.values())
    for _ in range(rng.randint(3, 9)):
        when = world.now - timedelta(minutes=rng.randint(30, 60 * 24 * 6))
        message = TextMessage(
            id=new_id("msg"),
            direction=rng.choice(("inbox", "outbox")),
            phone=rng.choice(people).phone,
            body=rng.choice(vocab.BACKGROUND_MESSAGES),
            time=fmt_moment(when),
        )
        world.messages[message.id] = message
    for label in rng.sample(vocab.BACKGROUND_ALARM_LABELS, rng.randint(1, 4)):
        alarm = Alarm(
            id=new_id("alarm"),
            time=f"{rng.randint(5, 9):02d}:{rng.choice((0, 15, 30, 45)):02d}",
            label=label,
            repeat=rng.choice(("once", "daily", "weekdays")),
            enabled=rng.random() < 0.8,
        )
        world.alarms[alarm.id] = alarm
    for text in rng.sample(vocab.BACKGROUND_CHORES, rng.randint(1, 3)):
        due = world.now + timedelta(days=rng.randint(3, 20), hours=rng.randint(0, 8))
        reminder = Reminder(id=new_id("reminder"), text=text, due=fmt_moment(due))
        world.reminders[reminder.id] = reminder
    # Background events stay 3+ days out: tasks only talk about today, tomorrow and the day after.
    for title in rng.sample(vocab.BACKGROUND_EVENT_TITLES, rng.randint(2, 5)):
        day = (world.now + timedelta(days=rng.randint(3, 20))).replace(minute=0)
        start = day.replace(hour=rng.randint(8, 18))
        event = Event(new_id("event"), title, fmt_moment(start), rng.choice((30, 60, 90)))
        world.events[event.id] = event
    for title, body in rng.sample(vocab.BACKGROUND_NOTE_TOPICS, rng.randint(1, 3)):
        note = Note(id=new_id("note"), title=title, body=body)
        world.notes[note.id] = note
    world.settings.update(random_settings(rng))
    for code, (_, level) in vocab.CURRENCIES.items():
        world.rates[code] = jitter_rate(rng, level)
    for city in rng.sample(vocab.BACKGROUND_CITIES, rng.randint(3, 6)):
        world.weather[city] = random_weather(rng, city)


def random_phone(rng: random.Random) -> str:
    return f"+1{rng.randint(201, 989)}{rng.randint(200, 999)}{rng.randint(0, 9999):04d}"


def random_settings(rng: random.Random) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for name, spec in vocab.SETTINGS.items():
        if spec["type"] == "bool":
            settings[name] = rng.random() < 0.5
        elif spec["type"] == "int":
            settings[name] = rng.randint(2, 19) * 5
        else:
            settings[name] = rng.choice(spec["values"])
    return settings


def jitter_rate(rng: random.Random, level: float) -> float:
    return 1.0 if level == 1.0 else round(level * rng.uniform(0.95, 1.05), 4)


def random_weather(rng: random.Random, city: str) -> dict[str, Any]:
    return {
        "city": city,
        "condition": rng.choice(list(vocab.WEATHER_CONDITIONS)),
        "temperature_c": rng.randint(-8, 36),
        "humidity_percent": rng.randint(20, 95),
    }


def exchange_rate(rates: dict[str, float], source: str, target: str) -> float:
    """Units of `target` per 1 `source`, rounded as the tool reports it."""
    return round(rates[target] / rates[source], 4)


def convert(rates: dict[str, float], amount: float, source: str, target: str) -> float:
    return round(amount * rates[target] / rates[source], 2)
