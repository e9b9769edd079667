"""Expected values as data: what a right argument, or a right reply, must hold.

A scenario writes matchers into its task data (`{"kind": "clock", "value": "19:30"}`); the
checks read them back. Argument matchers normalise the way the tool does (so `7:05` matches
`07:05`, `+1 415 555 0134` matches `+14155550134`); reply matchers reuse the toolbox's
conversation checks (spelling variants, numbers within a tolerance, phone digits).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from shared.envs.toolbox import checks as toolbox_checks
from shared.envs.toolbox.checks import Trace
from shared.envs.toolbox.clock import fmt_moment, parse_clock, parse_moment
from shared.envs.toolbox.comms import normalize_phone
from shared.envs.tools import ToolError

Matcher = dict[str, Any]


def eq(value: str) -> Matcher:
    """The same text, ignoring case and surrounding spaces."""
    return {"kind": "eq", "value": value}


def clock(value: str) -> Matcher:
    return {"kind": "clock", "value": value}


def moment(value: str) -> Matcher:
    return {"kind": "moment", "value": value}


def phone(value: str) -> Matcher:
    return {"kind": "phone", "value": value}


def number(value: float, tolerance: float = 0.0) -> Matcher:
    return {"kind": "number", "value": value, "tolerance": tolerance}


def has(words: Iterable[str]) -> Matcher:
    """Text containing every one of `words` (case-insensitive)."""
    return {"kind": "has", "value": list(words)}


def phrases(any_of: Iterable[str]) -> Matcher:
    """Reply only: names the value in one of these spellings."""
    return {"kind": "phrases", "value": list(any_of)}


def argument_matches(matcher: Matcher, actual: Any) -> bool:
    kind, expected = matcher["kind"], matcher["value"]
    if kind == "number":
        numeric = isinstance(actual, int | float) and not isinstance(actual, bool)
        return numeric and abs(actual - expected) <= matcher["tolerance"]
    if not isinstance(actual, str):
        return False
    if kind == "eq":
        return actual.strip().lower() == str(expected).strip().lower()
    if kind == "has":
        return all(word.lower() in actual.lower() for word in expected)
    try:
        if kind == "clock":
            return parse_clock(actual) == expected
        if kind == "phone":
            return normalize_phone(actual) == expected
        if kind == "moment":
            anchor = datetime.fromisoformat(expected)
            return fmt_moment(parse_moment(actual, anchor)) == expected
    except ToolError:
        return False
    raise ValueError(f"unknown argument matcher {kind!r}")


def reply_matches(matcher: Matcher, trace: Trace) -> bool:
    """Some assistant text in the episode names the value."""
    kind, expected = matcher["kind"], matcher["value"]
    if kind == "phrases":
        return toolbox_checks.reply_mentions(trace, any_of=expected)
    if kind == "number":
        return toolbox_checks.reply_mentions_number(trace, expected, matcher["tolerance"])
    if kind == "phone":
        return toolbox_checks.reply_mentions_phone(trace, expected)
    raise ValueError(f"unknown reply matcher {kind!r}")
