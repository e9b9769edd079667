"""Time tools: the clock, alarms, reminders and calendar events."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from shared.envs.toolbox.clock import (
    WEEKDAYS,
    fmt_date,
    fmt_moment,
    parse_clock,
    parse_date,
    parse_moment,
)
from shared.envs.toolbox.params import CLOCK, DAY, MOMENT, boolean, enum, integer, params, string
from shared.envs.toolbox.world import Alarm, Event, Reminder, World
from shared.envs.tools import Tool, ToolError

REPEATS = ("once", "daily", "weekdays", "weekends")


def schedule_tools(world: World) -> list[Tool]:
    def future(moment: datetime, field: str) -> None:
        if moment <= world.now:
            raise ToolError(
                f"{field} {fmt_moment(moment)} is in the past (it is now {fmt_moment(world.now)})"
            )

    def get_current_time() -> dict[str, Any]:
        return {
            "datetime": fmt_moment(world.now),
            "date": fmt_date(world.now),
            "time": world.now.strftime("%H:%M"),
            "weekday": WEEKDAYS[world.now.weekday()],
        }

    def set_alarm(time: str, label: str = "", repeat: str = "once") -> dict[str, Any]:
        alarm = Alarm(world.new_id("alarm"), parse_clock(time), label.strip(), repeat)
        world.alarms[alarm.id] = alarm
        return asdict(alarm)

    def list_alarms() -> list[dict[str, Any]]:
        return [asdict(a) for a in sorted(world.alarms.values(), key=lambda a: (a.time, a.id))]

    def delete_alarm(alarm_id: str) -> dict[str, Any]:
        alarm = world.alarms.pop(alarm_id, None)
        if alarm is None:
            raise ToolError(f"no alarm with id {alarm_id!r}; use list_alarms to see ids")
        return {"deleted": alarm_id, "time": alarm.time, "label": alarm.label}

    def add_reminder(text: str, due: str) -> dict[str, Any]:
        if not text.strip():
            raise ToolError("text must not be empty")
        moment = parse_moment(due, world.now, "due")
        future(moment, "due")
        reminder = Reminder(world.new_id("reminder"), text.strip(), fmt_moment(moment))
        world.reminders[reminder.id] = reminder
        return asdict(reminder)

    def list_reminders(include_completed: bool = False) -> list[dict[str, Any]]:
        rows = [r for r in world.reminders.values() if include_completed or not r.completed]
        return [asdict(r) for r in sorted(rows, key=lambda r: (r.due, r.id))]

    def complete_reminder(reminder_id: str) -> dict[str, Any]:
        reminder = world.reminders.get(reminder_id)
        if reminder is None:
            raise ToolError(f"no reminder with id {reminder_id!r}; use list_reminders to see ids")
        if reminder.completed:
            raise ToolError(f"reminder {reminder_id} is already completed")
        reminder.completed = True
        return asdict(reminder)

    def create_event(
        title: str,
        start: str,
        duration_minutes: int,
        attendees: list[str] | None = None,
        location: str = "",
    ) -> dict[str, Any]:
        if not title.strip():
            raise ToolError("title must not be empty")
        begin = parse_moment(start, world.now)
        future(begin, "start")
        for contact_id in attendees or []:
            if contact_id not in world.contacts:
                raise ToolError(f"attendee {contact_id!r} is not a contact id; use search_contacts")
        end = begin + timedelta(minutes=duration_minutes)
        for other in world.events.values():
            other_begin = datetime.fromisoformat(other.start)
            other_end = other_begin + timedelta(minutes=other.duration_minutes)
            if begin < other_end and other_begin < end:
                raise ToolError(
                    f"conflicts with {other.title!r} ({other.start}, "
                    f"{other.duration_minutes} min, id {other.id}); pick another time"
                )
        event = Event(
            world.new_id("event"),
            title.strip(),
            fmt_moment(begin),
            duration_minutes,
            list(attendees or []),
            location,
        )
        world.events[event.id] = event
        return asdict(event)

    def list_events(date: str | None = None, query: str = "") -> list[dict[str, Any]]:
        day = fmt_date(parse_date(date, world.now)) if date is not None else None
        needle = query.strip().lower()
        rows = [
            e
            for e in world.events.values()
            if (e.start[:10] == day if day else e.start >= fmt_moment(world.now))
            and needle in e.title.lower()
        ]
        return [asdict(e) for e in sorted(rows, key=lambda e: (e.start, e.id))]

    def delete_event(event_id: str) -> dict[str, Any]:
        event = world.events.pop(event_id, None)
        if event is None:
            raise ToolError(f"no event with id {event_id!r}; use list_events to see ids")
        return {"deleted": event_id, "title": event.title, "start": event.start}

    return [
        Tool(
            "get_current_time",
            "The current date, time and weekday.",
            params(),
            get_current_time,
        ),
        Tool(
            "set_alarm",
            "Create an alarm.",
            params(
                ["time"],
                time=CLOCK,
                label=string("Name shown when it rings."),
                repeat=enum("How often it rings.", REPEATS),
            ),
            set_alarm,
        ),
        Tool("list_alarms", "All alarms, by time.", params(), list_alarms),
        Tool(
            "delete_alarm",
            "Delete one alarm by id.",
            params(["alarm_id"], alarm_id=string("Alarm id, e.g. alarm-123.")),
            delete_alarm,
        ),
        Tool(
            "add_reminder",
            "Create a reminder that fires at a future date and time.",
            params(["text", "due"], text=string("What to be reminded of."), due=MOMENT),
            add_reminder,
        ),
        Tool(
            "list_reminders",
            "Reminders by due time (open ones unless include_completed).",
            params(include_completed=boolean("Also list completed reminders.")),
            list_reminders,
        ),
        Tool(
            "complete_reminder",
            "Mark a reminder as done.",
            params(["reminder_id"], reminder_id=string("Reminder id, e.g. reminder-123.")),
            complete_reminder,
        ),
        Tool(
            "create_event",
            "Add a calendar event in the future; it must not overlap another event.",
            params(
                ["title", "start", "duration_minutes"],
                title=string("Event title."),
                start=MOMENT,
                duration_minutes=integer("Length in minutes.", 5, 1440),
                attendees={
                    "type": "array",
                    "description": "Contact ids of people to invite.",
                    "items": {"type": "string"},
                    "uniqueItems": True,
                },
                location=string("Where it takes place."),
            ),
            create_event,
        ),
        Tool(
            "list_events",
            "Calendar events on a date and/or whose title contains `query`; with neither, "
            "all upcoming events.",
            params(date=DAY, query=string("Text the title must contain.")),
            list_events,
        ),
        Tool(
            "delete_event",
            "Delete (cancel) a calendar event by id.",
            params(["event_id"], event_id=string("Event id, e.g. event-123.")),
            delete_event,
        ),
    ]
