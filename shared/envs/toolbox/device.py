"""Device and utility tools: settings, currency exchange, weather and notes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from shared.envs.toolbox import vocab
from shared.envs.toolbox.params import CURRENCY, enum, params, string
from shared.envs.toolbox.world import Note, World, convert, exchange_rate
from shared.envs.tools import Tool, ToolError


def check_setting(name: str, value: Any) -> Any:
    """The value if `name` accepts it, else a `ToolError` saying what it accepts."""
    spec = vocab.SETTINGS[name]
    if spec["type"] == "bool":
        if not isinstance(value, bool):
            raise ToolError(f"{name} takes true or false, not {value!r}")
    elif spec["type"] == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolError(f"{name} takes an integer {spec['min']}-{spec['max']}, not {value!r}")
        if not spec["min"] <= value <= spec["max"]:
            raise ToolError(f"{name} must be between {spec['min']} and {spec['max']}, not {value}")
    elif value not in spec["values"]:
        raise ToolError(f"{name} must be one of {', '.join(spec['values'])}, not {value!r}")
    return value


def device_tools(world: World) -> list[Tool]:
    def get_setting(name: str) -> dict[str, Any]:
        return {"name": name, "value": world.settings[name]}

    def set_setting(name: str, value: bool | int | str) -> dict[str, Any]:
        previous = world.settings[name]
        world.settings[name] = check_setting(name, value)
        return {"name": name, "value": value, "previous": previous}

    def get_exchange_rate(from_currency: str, to_currency: str) -> dict[str, Any]:
        rate = exchange_rate(world.rates, from_currency, to_currency)
        return {"from": from_currency, "to": to_currency, "rate": rate}

    def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict[str, Any]:
        if not 0 < amount <= 1e12:  # also refuses NaN, which json.loads accepts
            raise ToolError(f"amount must be a positive number up to 1e12, not {amount!r}")
        return {
            "amount": amount,
            "from": from_currency,
            "to": to_currency,
            "rate": exchange_rate(world.rates, from_currency, to_currency),
            "result": convert(world.rates, amount, from_currency, to_currency),
        }

    def get_weather(city: str) -> dict[str, Any]:
        wanted = city.strip().lower()
        for name, report in world.weather.items():
            if name.lower() == wanted:
                return dict(report)
        known = ", ".join(sorted(world.weather))
        raise ToolError(f"no weather data for {city!r}; available cities: {known}")

    def create_note(title: str, body: str) -> dict[str, Any]:
        if not title.strip():
            raise ToolError("title must not be empty")
        note = Note(world.new_id("note"), title.strip(), body)
        world.notes[note.id] = note
        return asdict(note)

    def search_notes(query: str = "") -> list[dict[str, Any]]:
        needle = query.strip().lower()
        rows = [n for n in world.notes.values() if needle in f"{n.title} {n.body}".lower()]
        return [asdict(n) for n in sorted(rows, key=lambda n: (n.title, n.id))]

    setting = enum("Setting name.", list(vocab.SETTINGS))
    currency_pair = {"from_currency": CURRENCY, "to_currency": CURRENCY}
    return [
        Tool("get_setting", "Read a device setting.", params(["name"], name=setting), get_setting),
        Tool(
            "set_setting",
            "Change a device setting. wifi, bluetooth, do_not_disturb, location_services, "
            "dark_mode and low_power_mode take true/false; brightness and volume an integer "
            "0-100; ringtone one of " + ", ".join(vocab.SETTINGS["ringtone"]["values"]) + ".",
            params(
                ["name", "value"],
                name=setting,
                value={"type": ["boolean", "integer", "string"], "description": "New value."},
            ),
            set_setting,
        ),
        Tool(
            "get_exchange_rate",
            "Units of to_currency per 1 from_currency.",
            params(["from_currency", "to_currency"], **currency_pair),
            get_exchange_rate,
        ),
        Tool(
            "convert_currency",
            "Convert an amount between currencies at today's rate (result rounded to cents).",
            params(
                ["amount", "from_currency", "to_currency"],
                amount={
                    "type": "number",
                    "description": "Amount to convert.",
                    "exclusiveMinimum": 0,
                },
                **currency_pair,
            ),
            convert_currency,
        ),
        Tool(
            "get_weather",
            "Current weather in a city.",
            params(["city"], city=string("City name, e.g. Lisbon.")),
            get_weather,
        ),
        Tool(
            "create_note",
            "Save a note.",
            params(["title", "body"], title=string("Note title."), body=string("Note text.")),
            create_note,
        ),
        Tool(
            "search_notes",
            "Notes whose title or text contains `query` (empty lists all).",
            params(query=string("Text to look for.")),
            search_notes,
        ),
    ]
