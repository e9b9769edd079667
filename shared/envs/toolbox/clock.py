"""Time formats the toolbox speaks: `HH:MM` clock times and `YYYY-MM-DD HH:MM` moments.

Parsers raise `ToolError` with the expected format, so a tool can pass the message straight
back to the agent.
"""

from __future__ import annotations

import re
from datetime import date, datetime

from shared.envs.tools import ToolError

DATE_FORMAT = "%Y-%m-%d"
MOMENT_FORMAT = "%Y-%m-%d %H:%M"
MAX_YEARS_AHEAD = 5
"""Dates further out are refused: no one books a dentist in 2090, and it keeps arithmetic safe."""

_CLOCK = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_MOMENT = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T]([01]?\d|2[0-3]):([0-5]\d)(:00)?$")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def parse_clock(text: str, field: str = "time") -> str:
    """`7:05` or `07:05` -> `07:05`."""
    match = _CLOCK.match(text.strip())
    if not match:
        raise ToolError(f"invalid {field} {text!r}: use 24-hour HH:MM, e.g. 07:30 or 18:45")
    return f"{int(match.group(1)):02d}:{match.group(2)}"


def parse_date(text: str, now: datetime, field: str = "date") -> date:
    try:
        day = datetime.strptime(text.strip(), DATE_FORMAT).date()
    except ValueError:
        raise ToolError(f"invalid {field} {text!r}: use YYYY-MM-DD, e.g. 2025-03-14") from None
    _check_range(day, now, field)
    return day


def parse_moment(text: str, now: datetime, field: str = "start") -> datetime:
    """`2025-03-14 09:00` (or with a `T`) -> datetime, within a few years of `now`."""
    match = _MOMENT.match(text.strip())
    if not match:
        raise ToolError(f"invalid {field} {text!r}: use YYYY-MM-DD HH:MM, e.g. 2025-03-14 18:30")
    try:
        day = datetime.strptime(match.group(1), DATE_FORMAT)
    except ValueError:
        raise ToolError(f"invalid {field} {text!r}: no such date") from None
    _check_range(day.date(), now, field)
    return day.replace(hour=int(match.group(2)), minute=int(match.group(3)))


def _check_range(day: date, now: datetime, field: str) -> None:
    if abs(day.year - now.year) > MAX_YEARS_AHEAD:
        raise ToolError(f"{field} {day.isoformat()} is too far from today ({now:{DATE_FORMAT}})")


def fmt_moment(moment: datetime) -> str:
    return moment.strftime(MOMENT_FORMAT)


def fmt_date(day: date | datetime) -> str:
    return day.strftime(DATE_FORMAT)


def clock_minus(clock: str, minutes: int) -> str:
    """`08:15` minus 30 -> `07:45` (wrapping at midnight)."""
    hours, mins = (int(p) for p in clock.split(":"))
    total = (hours * 60 + mins - minutes) % (24 * 60)
    return f"{total // 60:02d}:{total % 60:02d}"


def spoken_clock(clock: str) -> list[str]:
    """Ways a reply may write a clock time: `14:30`, `2:30 pm`, `2:30pm`, `2:30 PM`."""
    hours, mins = (int(p) for p in clock.split(":"))
    twelve = hours % 12 or 12
    suffix = "am" if hours < 12 else "pm"
    variants = [
        f"{hours:02d}:{mins:02d}",
        f"{twelve}:{mins:02d} {suffix}",
        f"{twelve}:{mins:02d}{suffix}",
    ]
    if mins == 0:
        variants += [f"{twelve} {suffix}", f"{twelve}{suffix}"]
    return variants
