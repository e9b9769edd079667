"""report_result tasks: look a value up and tell the user; the final text must carry it."""

from __future__ import annotations

from shared.envs.toolbox import vocab
from shared.envs.toolbox.builder import TaskBuilder, spoken_date
from shared.envs.toolbox.clock import spoken_clock
from shared.envs.toolbox.world import convert, exchange_rate


def rate(b: TaskBuilder) -> None:
    source, target = b.rng.sample(list(vocab.CURRENCIES), 2)
    value = exchange_rate(b.rates(source, target), source, target)
    b.request = b.rng.choice(
        (
            f"What's the exchange rate from {source} to {target}?",
            f"How many {vocab.CURRENCIES[target][0]} do I get for one {source}?",
        )
    )
    b.call("get_exchange_rate", from_currency=source, to_currency=target)
    b.say(f"1 {source} = {value} {target}.")
    b.milestone(
        "reported_rate", "reply_mentions_number", value=value, tolerance=max(0.0001, value * 0.005)
    )


def conversion(b: TaskBuilder) -> None:
    source, target = b.rng.sample(list(vocab.CURRENCIES), 2)
    rates = b.rates(source, target)
    amount = b.rng.choice((10, 30, 60, 85, 200, 350, 900, 2500, 10000))
    result = convert(rates, amount, source, target)
    b.request = (
        f"How much is {amount} {vocab.CURRENCIES[source][0]} in {vocab.CURRENCIES[target][0]}?"
    )
    b.call("convert_currency", amount=amount, from_currency=source, to_currency=target)
    b.say(f"{amount} {source} is about {result:,.2f} {target}.")
    b.milestone(
        "reported_amount",
        "reply_mentions_number",
        value=result,
        tolerance=max(0.01, result * 0.001),
    )


def phone_number(b: TaskBuilder) -> None:
    person, _ = b.person(), b.person()
    first = person["name"].split()[0]
    b.request = b.rng.choice((f"What's {first}'s phone number?", f"I need {first}'s number."))
    b.call("search_contacts", query=first)
    b.say(f"{person['name']}'s number is {person['phone']}.")
    b.milestone("reported_number", "reply_mentions_phone", phone=person["phone"])


def weather(b: TaskBuilder) -> None:
    city = b.rng.choice(vocab.TASK_CITIES)
    report = b.weather(city)
    b.request = b.rng.choice(
        (f"What's the weather like in {city}?", f"How warm is it in {city} right now?")
    )
    b.call("get_weather", city=city)
    b.say(f"It's {report['condition']} in {city}, {report['temperature_c']}°C.")
    b.milestone(
        "reported_temperature",
        "reply_mentions_number",
        value=report["temperature_c"],
        tolerance=0.5,
    )
    words = list(vocab.WEATHER_CONDITIONS[report["condition"]])
    b.milestone("reported_condition", "reply_mentions", weight=0.5, any_of=words)


def event_time(b: TaskBuilder) -> None:
    title, other = b.rng.sample(vocab.TASK_EVENT_TITLES, 2)
    start = b.slot(b.rng.randint(1, 2))
    b.event(title, start, b.rng.choice((30, 60)))
    b.event(other, b.slot(b.rng.randint(1, 2)), 30)
    b.request = f"What time is my {title} on {spoken_date(start)}?"
    b.call("list_events", query=title)
    b.say(f"Your {title} is at {start:%H:%M} on {spoken_date(start)}.")
    b.milestone("reported_time", "reply_mentions", any_of=spoken_clock(f"{start:%H:%M}"))


def setting_value(b: TaskBuilder) -> None:
    name = b.rng.choice((*vocab.LEVEL_SETTINGS, "ringtone"))
    spec = vocab.SETTINGS[name]
    phrase = spec["phrase"]
    b.request = b.rng.choice(
        (
            f"What's my {phrase} set to?",
            f"Tell me my current {phrase}.",
            f"What is the {phrase} at right now?",
            f"Check my {phrase} for me.",
        )
    )
    b.call("get_setting", name=name)
    if spec["type"] == "int":
        value = b.rng.randint(1, 19) * 5
        b.setting(name, value)
        b.say(f"Your {phrase} is at {value}%.")
        b.milestone("reported_value", "reply_mentions_number", value=value, tolerance=0)
    else:
        tone = b.rng.choice(spec["values"])
        b.setting(name, tone)
        b.say(f"Your ringtone is {tone}.")
        b.milestone("reported_value", "reply_mentions", any_of=[tone])


def last_message(b: TaskBuilder) -> None:
    person = b.person()
    first = person["name"].split()[0]
    (old, _), (body, keyword) = b.rng.sample(vocab.INBOX_FACTS, 2)
    b.inbox(person, old, minutes_ago=b.rng.randint(600, 3000))
    b.inbox(person, body, minutes_ago=b.rng.randint(5, 500))
    b.request = b.rng.choice(
        (f"What did {first} say in their last message?", f"Read me the latest text from {first}.")
    )
    b.call("search_contacts", query=first)
    b.call("search_messages", contact_id=person["id"], direction="inbox", limit=1)
    b.say(f'{person["name"]} wrote: "{body}"')
    b.milestone("reported_message", "reply_mentions", any_of=[keyword])


TEMPLATES = (rate, conversion, phone_number, weather, event_time, setting_value, last_message)
