"""insufficient_information tasks: no tool or no data can serve the request.

The right move is to say so (after read-only look-ups, if any) and change nothing: the only
milestone is an explaining reply, and any side effect zeroes the reward.
"""

from __future__ import annotations

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder


def _explained(b: TaskBuilder, text: str) -> None:
    b.say(text)
    b.milestone("explained_cannot_do", "explained")


def unknown_contact(b: TaskBuilder) -> None:
    b.person()
    b.person()
    missing = b.first_name()
    body, _ = b.rng.choice(vocab.MESSAGE_BODIES)
    b.request = f"Text {missing} saying: {body}."
    b.call("search_contacts", query=missing)
    _explained(
        b, f"I couldn't find anyone named {missing} in your contacts, so I can't send that message."
    )


def unsupported_action(b: TaskBuilder) -> None:
    if b.rng.random() < 0.4:
        b.request = b.rng.choice(vocab.UNSUPPORTED_REQUESTS)
    else:
        person = b.person()
        b.request = b.rng.choice(vocab.UNSUPPORTED_WITH_CONTACT).format(
            name=person["name"].split()[0]
        )
    _explained(b, "Sorry, I can't do that: none of my tools can carry out this request.")


def unsupported_currency(b: TaskBuilder) -> None:
    source = b.rng.choice(list(vocab.CURRENCIES))
    target = b.rng.choice(vocab.UNSUPPORTED_CURRENCIES)
    amount = b.rng.choice((10, 25, 80, 150, 400, 999, 2500))
    b.request = f"How much is {amount} {vocab.CURRENCIES[source][0]} in {target}?"
    _explained(b, f"I can't convert to {target}: it isn't one of the currencies I support.")


def unknown_city(b: TaskBuilder) -> None:
    known, missing = b.rng.sample(vocab.TASK_CITIES, 2)
    b.weather(known)
    b.request = b.rng.choice(
        (f"What's the weather in {missing} right now?", f"Is it raining in {missing}?")
    )
    b.call("get_weather", city=missing)
    _explained(b, f"Sorry, I don't have weather data for {missing}.")


def no_messages(b: TaskBuilder) -> None:
    person = b.person()
    first = person["name"].split()[0]
    b.request = f"What did {first} say in their last message?"
    b.call("search_contacts", query=first)
    b.call("search_messages", contact_id=person["id"])
    _explained(
        b, f"There are no messages from {person['name']}, so I can't tell you what they said."
    )


def missing_event(b: TaskBuilder) -> None:
    title, present = b.rng.sample(vocab.TASK_EVENT_TITLES, 2)
    b.event(present, b.slot(1), 60)
    b.request = b.rng.choice((f"What time is my {title}?", f"When is my {title} this week?"))
    b.call("list_events", query=title)
    _explained(b, f"I couldn't find a {title} on your calendar.")


TEMPLATES = (
    unknown_contact,
    unsupported_action,
    unsupported_currency,
    unknown_city,
    no_messages,
    missing_event,
)
