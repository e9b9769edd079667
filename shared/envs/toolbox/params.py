"""Small builders for the JSON schemas of tool arguments (strict objects, described fields)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.envs.toolbox import vocab


def params(required: Sequence[str] = (), **properties: dict[str, Any]) -> dict[str, Any]:
    """An arguments object: only these properties, the listed ones required."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def enum(description: str, values: Sequence[str]) -> dict[str, Any]:
    return {"type": "string", "description": description, "enum": list(values)}


def integer(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": minimum, "maximum": maximum}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


CURRENCY = enum("ISO 4217 currency code.", list(vocab.CURRENCIES))
CLOCK = string("Time of day, 24-hour HH:MM (e.g. 07:30).")
MOMENT = string("Date and time, YYYY-MM-DD HH:MM (24-hour).")
DAY = string("Date, YYYY-MM-DD.")
