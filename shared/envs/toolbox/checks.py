"""The checks milestones and forbidden actions are written in, over one episode's trace.

A task names a check and its arguments as data (`{"check": "alarm_created", "args": {"time":
"07:30"}}`); `CHECKS[name](trace, **args)` says whether it holds. World checks compare the
initial and final world ("created" means an entity that did not exist at the start), the
conversation checks read the transcript, and the call checks read the `ToolBox` records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shared.envs.protocol import Message
from shared.envs.toolbox.tools import MUTATING
from shared.envs.toolbox.world import World
from shared.envs.tools import CallRecord

INABILITY = (
    "can't", "cannot", "can not", "unable", "not able", "couldn't", "could not", "don't have",
    "do not have", "doesn't have", "does not have", "no way to", "not possible", "isn't possible",
    "not supported", "isn't supported", "don't support", "doesn't support", "does not support",
    "not available", "isn't available", "no contact", "not find", "no weather",
    "no messages", "no data", "not in your contacts", "unfortunately", "sorry",
)  # fmt: skip
"""Phrases that mark a reply as saying the request cannot be done."""


@dataclass(frozen=True)
class Trace:
    initial: World
    world: World
    transcript: list[Message]
    """The conversation after the system prompt: opening messages, then every step."""
    calls: list[CallRecord]
    opening: int
    """How many transcript messages opened the episode (the rest came from steps)."""


def timeline(trace: Trace) -> Iterator[tuple[Message, CallRecord | None]]:
    """Each step message, with its call record for tool messages (one record per tool message)."""
    calls = iter(trace.calls)
    for message in trace.transcript[trace.opening :]:
        yield message, next(calls, None) if message.role == "tool" else None


def assistant_texts(trace: Trace) -> list[str]:
    return [m.content for m in trace.transcript if m.role == "assistant" and m.content]


def final_text(trace: Trace) -> str:
    replies = [m for m in trace.transcript if m.role == "assistant" and not m.tool_calls]
    return (replies[-1].content or "") if replies else ""


def mentions(text: str, phrase: str) -> bool:
    """`phrase` in `text`, case-insensitive, not glued to letters or digits on either side."""
    pattern = rf"(?<![0-9a-z]){re.escape(phrase.lower())}(?![0-9a-z])"
    return re.search(pattern, _plain(text).lower()) is not None


def _plain(text: str) -> str:
    """Typographic apostrophes and minus signs as ASCII."""
    return text.replace("\u2019", "'").replace("\u2018", "'").replace("\u2212", "-")


def _same(a: str | None, b: str | None) -> bool:
    return (a or "").strip().lower() == (b or "").strip().lower()


def _has_all(text: str, words: list[str]) -> bool:
    return all(word.lower() in text.lower() for word in words)


def _new(initial: dict[str, Any], final: dict[str, Any]) -> list[Any]:
    return [row for key, row in final.items() if key not in initial]


# -- the world -------------------------------------------------------------------------------


def alarm_created(trace: Trace, time: str, label: str | None = None) -> bool:
    return any(
        a.time == time and (label is None or _same(a.label, label))
        for a in _new(trace.initial.alarms, trace.world.alarms)
    )


def alarm_deleted(trace: Trace, alarm_id: str) -> bool:
    return alarm_id in trace.initial.alarms and alarm_id not in trace.world.alarms


def reminder_created(trace: Trace, due: str, contains: list[str]) -> bool:
    return any(
        r.due == due and _has_all(r.text, contains)
        for r in _new(trace.initial.reminders, trace.world.reminders)
    )


def reminder_completed(trace: Trace, reminder_id: str) -> bool:
    reminder = trace.world.reminders.get(reminder_id)
    return reminder is not None and reminder.completed


def event_created(
    trace: Trace,
    title: str,
    start: str,
    duration_minutes: int | None = None,
    attendees: list[str] | None = None,
) -> bool:
    return any(
        title.lower() in e.title.lower()
        and e.start == start
        and (duration_minutes is None or e.duration_minutes == duration_minutes)
        and set(attendees or []) <= set(e.attendees)
        for e in _new(trace.initial.events, trace.world.events)
    )


def event_deleted(trace: Trace, event_id: str) -> bool:
    return event_id in trace.initial.events and event_id not in trace.world.events


def contact_created(trace: Trace, name: str, phone: str, email: str | None = None) -> bool:
    return any(
        _same(c.name, name) and c.phone == phone and (email is None or _same(c.email, email))
        for c in _new(trace.initial.contacts, trace.world.contacts)
    )


def contact_field(trace: Trace, contact_id: str, field: str, value: str) -> bool:
    contact = trace.world.contacts.get(contact_id)
    return contact is not None and _same(getattr(contact, field), value)


def note_created(trace: Trace, title: str, contains: list[str]) -> bool:
    return any(
        _same(n.title, title) and _has_all(n.body, contains)
        for n in _new(trace.initial.notes, trace.world.notes)
    )


def message_sent(trace: Trace, phone: str, contains: list[str]) -> bool:
    return any(
        m.direction == "outbox" and m.phone == phone and _has_all(m.body, contains)
        for m in _new(trace.initial.messages, trace.world.messages)
    )


def setting_equals(trace: Trace, name: str, value: Any) -> bool:
    current = trace.world.settings.get(name)
    return type(current) is type(value) and current == value


# -- the conversation ------------------------------------------------------------------------


def reply_mentions(trace: Trace, any_of: list[str]) -> bool:
    """Some assistant text names the value, in one of the accepted spellings."""
    return any(mentions(text, phrase) for text in assistant_texts(trace) for phrase in any_of)


def reply_mentions_number(trace: Trace, value: float, tolerance: float) -> bool:
    for text in assistant_texts(trace):
        for token in re.findall(r"-?\d[\d,]*(?:\.\d+)?", _plain(text)):
            number = float(token.replace(",", ""))
            if min(abs(number - value), abs(abs(number) - value)) <= tolerance:
                return True
    return False


def reply_mentions_phone(trace: Trace, phone: str) -> bool:
    """The number's digits appear in a reply, with or without the +1 (every world number is +1)."""
    national = phone.lstrip("+")[1:]
    return any(national in re.sub(r"\D", "", text) for text in assistant_texts(trace))


def explained(trace: Trace) -> bool:
    """The final reply says the request cannot be done."""
    text = final_text(trace)
    return any(mentions(text, phrase) for phrase in INABILITY)


def asked_first(trace: Trace) -> bool:
    """The user supplied the missing detail, and nothing was changed before they did."""
    for message, record in timeline(trace):
        if message.role == "user":
            return True
        if record is not None and record.ok and record.name in MUTATING:
            return False
    return False


def final_reply(trace: Trace) -> bool:
    """The agent did something and then closed with a text reply to the user."""
    steps = trace.transcript[trace.opening :]
    closed = bool(steps) and steps[-1].role == "assistant" and not steps[-1].tool_calls
    return closed and bool(steps[-1].content) and any(c.ok for c in trace.calls)


# -- forbidden actions -----------------------------------------------------------------------


def any_side_effect(trace: Trace) -> bool:
    return any(c.ok and c.name in MUTATING for c in trace.calls)


def message_to_other(trace: Trace, allowed: list[str]) -> bool:
    return any(
        m.direction == "outbox" and m.phone not in allowed
        for m in _new(trace.initial.messages, trace.world.messages)
    )


def deleted_other(trace: Trace, table: str, allowed: list[str]) -> bool:
    before, after = getattr(trace.initial, table), getattr(trace.world, table)
    return any(key not in after and key not in allowed for key in before)


def setting_changed_other(trace: Trace, allowed: list[str]) -> bool:
    before, after = trace.initial.settings, trace.world.settings
    return any(after[name] != before[name] and name not in allowed for name in before)


def completed_other(trace: Trace, allowed: list[str]) -> bool:
    before = trace.initial.reminders
    return any(
        r.completed and not before[key].completed and key not in allowed
        for key, r in trace.world.reminders.items()
        if key in before
    )


CHECKS: dict[str, Callable[..., bool]] = {
    fn.__name__: fn
    for fn in (
        alarm_created, alarm_deleted, reminder_created, reminder_completed, event_created,
        event_deleted, contact_created, contact_field, note_created, message_sent,
        setting_equals, reply_mentions, reply_mentions_number, reply_mentions_phone, explained,
        asked_first, final_reply, any_side_effect, message_to_other, deleted_other,
        setting_changed_other, completed_other,
    )
}  # fmt: skip
