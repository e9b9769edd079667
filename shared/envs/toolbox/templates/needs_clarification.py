"""needs_clarification tasks: a required detail is missing or ambiguous; ask, then act.

Each task scripts the user's answer; the `asked_first` milestone holds when that answer came
before any side effect, so guessing and acting first loses it.
"""

from __future__ import annotations

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder, spoken_date
from shared.envs.toolbox.clock import fmt_moment
from shared.envs.toolbox.world import convert


def _asked(b: TaskBuilder) -> None:
    b.milestone("asked_for_missing_detail", "asked_first")


def alarm_time(b: TaskBuilder) -> None:
    label = b.rng.choice(vocab.TASK_ALARM_LABELS)
    time = f"{b.rng.randint(5, 22):02d}:{b.rng.choice((0, 15, 30, 45)):02d}"
    b.request = b.rng.choice((f"Set an alarm called '{label}' for me.", f"Add a '{label}' alarm."))
    b.ask(f"What time should the '{label}' alarm go off?", f"{time}, please.")
    b.call("set_alarm", time=time, label=label)
    b.done(f"Your '{label}' alarm is set for {time}.")
    _asked(b)
    b.milestone("alarm_set", "alarm_created", time=time, label=label)


def message_body(b: TaskBuilder) -> None:
    person = b.person()
    first = person["name"].split()[0]
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = b.rng.choice((f"Send a message to {first}.", f"I want to text {first}."))
    b.ask(f"What would you like the message to {first} to say?", f"It should say: {body}.")
    b.call("search_contacts", query=first)
    b.call("send_message", phone_number=person["phone"], body=body)
    b.done(f"Sent to {person['name']}.")
    _asked(b)
    b.milestone("message_sent", "message_sent", phone=person["phone"], contains=list(words))
    b.allowed_phones.append(person["phone"])


def which_contact(b: TaskBuilder) -> None:
    first = b.first_name()
    one = b.person(first=first)
    while (two := b.person(first=first))["name"] == one["name"]:
        b.fixture["contacts"].pop()
    meant = one if b.rng.random() < 0.5 else two
    body, words = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = f"Text {first} saying: {body}."
    b.call("search_contacts", query=first)
    names = sorted((one["name"], two["name"]))
    b.ask(
        f"You have two contacts named {first}: {names[0]} and {names[1]}. Which one?",
        f"{meant['name']}.",
    )
    b.call("send_message", phone_number=meant["phone"], body=body)
    b.done(f"Sent to {meant['name']}.")
    _asked(b)
    b.milestone("message_sent", "message_sent", phone=meant["phone"], contains=list(words))
    b.allowed_phones.append(meant["phone"])


def reminder_time(b: TaskBuilder) -> None:
    chore, keyword = b.rng.choice(vocab.TASK_CHORES)
    due = b.slot(b.rng.randint(1, 14))
    b.request = f"Remind me to {chore}."
    b.ask("When should I remind you?", f"On {spoken_date(due, year=True)} at {due:%H:%M}.")
    b.call("add_reminder", text=chore, due=fmt_moment(due))
    b.done(f"I'll remind you to {chore} on {spoken_date(due)} at {due:%H:%M}.")
    _asked(b)
    b.milestone("reminder_added", "reminder_created", due=fmt_moment(due), contains=[keyword])


def convert_target(b: TaskBuilder) -> None:
    source, target = b.rng.sample(list(vocab.CURRENCIES), 2)
    rates = b.rates(source, target)
    amount = b.rng.choice((20, 40, 75, 120, 250, 600, 1200, 3000))
    result = convert(rates, amount, source, target)
    b.request = f"Convert {amount} {vocab.CURRENCIES[source][0]} for me."
    b.ask("Which currency should I convert it to?", f"To {vocab.CURRENCIES[target][0]}.")
    b.call("convert_currency", amount=amount, from_currency=source, to_currency=target)
    b.say(f"{amount} {source} is {result:,.2f} {target}.")
    _asked(b)
    b.milestone(
        "reported_amount",
        "reply_mentions_number",
        value=result,
        tolerance=max(0.01, result * 0.001),
    )


def event_time(b: TaskBuilder) -> None:
    title = b.rng.choice(vocab.TASK_EVENT_TITLES)
    start = b.slot(b.rng.randint(1, 2))
    minutes = b.rng.choice((30, 45, 60, 90))
    b.request = f"Add '{title}' to my calendar for {spoken_date(start, year=True)}."
    b.ask(
        "What time does it start, and how long is it?",
        f"It starts at {start:%H:%M} and lasts {minutes} minutes.",
    )
    b.call("create_event", title=title, start=fmt_moment(start), duration_minutes=minutes)
    b.done(f"'{title}' is on your calendar at {start:%H:%M} for {minutes} minutes.")
    _asked(b)
    b.milestone(
        "event_added",
        "event_created",
        title=title,
        start=fmt_moment(start),
        duration_minutes=minutes,
    )


TEMPLATES = (alarm_time, message_body, which_contact, reminder_time, convert_target, event_time)
