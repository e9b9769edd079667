"""error_recovery tasks: a tool fails or rejects the obvious call; read the error and recover.

Transient faults make the first call fail whatever the agent does; the other templates set up
a rejection (a number without its area code, a taken calendar slot, a time already past) that
the error message explains.
"""

from __future__ import annotations

from datetime import timedelta

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder, spoken_date
from shared.envs.toolbox.clock import fmt_moment
from shared.envs.toolbox.world import convert, random_phone

TRANSIENT = (
    "service temporarily unavailable (503); please retry",
    "request timed out; try again",
    "rate limited: too many requests, retry in a moment",
    "connection reset by the server; the request was not applied, please retry",
)


def _fault(b: TaskBuilder, tool: str) -> None:
    b.faults.append({"tool": tool, "times": 1, "error": b.rng.choice(TRANSIENT)})


def flaky_alarm(b: TaskBuilder) -> None:
    _fault(b, "set_alarm")
    time = f"{b.rng.randint(5, 22):02d}:{b.rng.choice((5, 10, 20, 25, 35, 40, 50, 55)):02d}"
    label = b.rng.choice(vocab.TASK_ALARM_LABELS)
    b.request = f"Could you set a '{label}' alarm at {time}?"
    b.call("set_alarm", time=time, label=label)
    b.call("set_alarm", time=time, label=label)
    b.done(f"The first try failed, but the '{label}' alarm is now set for {time}.")
    b.milestone("alarm_set", "alarm_created", time=time, label=label)


def flaky_message(b: TaskBuilder) -> None:
    _fault(b, "send_message")
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    phone = random_phone(b.rng)
    b.request = f"Please send this to {phone}: {body}."
    b.call("send_message", phone_number=phone, body=body)
    b.call("send_message", phone_number=phone, body=body)
    b.done(f"Sent to {phone} (on the second try).")
    b.milestone("message_sent", "message_sent", phone=phone, contains=list(words))
    b.allowed_phones.append(phone)


def flaky_conversion(b: TaskBuilder) -> None:
    _fault(b, "convert_currency")
    source, target = b.rng.sample(list(vocab.CURRENCIES), 2)
    rates = b.rates(source, target)
    amount = b.rng.choice((15, 35, 90, 140, 480, 720, 1800, 5000))
    result = convert(rates, amount, source, target)
    b.request = f"What's {amount} {source} in {target} today?"
    b.call("convert_currency", amount=amount, from_currency=source, to_currency=target)
    b.call("convert_currency", amount=amount, from_currency=source, to_currency=target)
    b.say(f"{amount} {source} is {result:,.2f} {target}.")
    b.milestone(
        "reported_amount",
        "reply_mentions_number",
        value=result,
        tolerance=max(0.01, result * 0.001),
    )


def local_number(b: TaskBuilder) -> None:
    person, _ = b.person(), b.person()
    first = person["name"].split()[0]
    local = f"{person['phone'][5:8]}-{person['phone'][8:]}"
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = f"Text {first} at {local} saying: {body}."
    b.call("send_message", phone_number=local, body=body)
    b.call("search_contacts", query=first)
    b.call("send_message", phone_number=person["phone"], body=body)
    b.done(
        f"{local} was missing its area code, so I used {first}'s saved number {person['phone']}."
    )
    b.milestone("message_sent", "message_sent", phone=person["phone"], contains=list(words))
    b.allowed_phones.append(person["phone"])


def taken_slot(b: TaskBuilder) -> None:
    title, busy = b.rng.sample(vocab.TASK_EVENT_TITLES, 2)
    start = b.slot(b.rng.randint(1, 2), latest=15)
    b.event(busy, start - timedelta(minutes=b.rng.choice((0, 15, 30))), 60)
    backup = start + timedelta(hours=b.rng.randint(2, 4))
    minutes = b.rng.choice((30, 45))
    b.request = (
        f"Book '{title}' on {spoken_date(start, year=True)} at {start:%H:%M} "
        f"for {minutes} minutes. If that time is taken, make it {backup:%H:%M} instead."
    )
    b.call("create_event", title=title, start=fmt_moment(start), duration_minutes=minutes)
    b.call("create_event", title=title, start=fmt_moment(backup), duration_minutes=minutes)
    b.done(f"{start:%H:%M} clashed with {busy}, so I booked '{title}' at {backup:%H:%M}.")
    b.milestone(
        "event_added",
        "event_created",
        title=title,
        start=fmt_moment(backup),
        duration_minutes=minutes,
    )


def past_reminder(b: TaskBuilder) -> None:
    chore, keyword = b.rng.choice(vocab.TASK_CHORES)
    earlier = b.now.replace(
        hour=b.rng.randint(6, b.now.hour - 1), minute=b.rng.choice((0, 15, 30, 45))
    )
    tomorrow = earlier + timedelta(days=1)
    b.request = (
        f"Remind me to {chore} today at {earlier:%H:%M}. "
        "If that time has already passed, set it for tomorrow at the same time."
    )
    b.call("get_current_time")
    b.call("add_reminder", text=chore, due=fmt_moment(earlier))
    b.call("add_reminder", text=chore, due=fmt_moment(tomorrow))
    b.done(
        f"{earlier:%H:%M} had already passed today, so I set it for tomorrow at {earlier:%H:%M}."
    )
    b.milestone("reminder_added", "reminder_created", due=fmt_moment(tomorrow), contains=[keyword])


TEMPLATES = (flaky_alarm, flaky_message, flaky_conversion, local_number, taken_slot, past_reminder)
