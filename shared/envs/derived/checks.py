"""Capability checks over any episode: what the agent's own turns and tool calls show, without
knowing the target's domain. Each gives a score in [0, 1]; contrast's catalogue names map to
one (`CHECKS`), and a capability without one is trained on the target's reward alone."""

from __future__ import annotations

from collections.abc import Callable

from shared.envs.protocol import Message
from shared.envs.tools import CallRecord

Check = Callable[[list[Message], list[CallRecord]], float]
_MALFORMED = (
    "invalid arguments",
    "arguments are not valid JSON",
    "arguments must be",
    "unknown tool",
)


def _malformed(call: CallRecord) -> bool:
    return not call.ok and (call.error or "").startswith(_MALFORMED)


def valid_arguments(_: list[Message], calls: list[CallRecord]) -> float:
    """The share of tool calls that named a real tool with schema-valid arguments."""
    if not calls:
        return 0.0
    return sum(not _malformed(c) for c in calls) / len(calls)


def used_tools(_: list[Message], calls: list[CallRecord]) -> float:
    """At least one successful tool call."""
    return 1.0 if any(c.ok for c in calls) else 0.0


def recovered(_: list[Message], calls: list[CallRecord]) -> float:
    """Every refused call was followed by a successful one (1 when nothing was refused but
    something succeeded)."""
    if not any(c.ok for c in calls):
        return 0.0
    last_ok = max(i for i, c in enumerate(calls) if c.ok)
    return 1.0 if all(c.ok or i < last_ok for i, c in enumerate(calls)) else 0.0


def reported(turns: list[Message], calls: list[CallRecord]) -> float:
    """A closing reply in words after the last successful call."""
    if not any(c.ok for c in calls) or not turns:
        return 0.0
    last = turns[-1]
    return (
        1.0
        if last.role == "assistant" and not last.tool_calls and (last.content or "").strip()
        else 0.0
    )


def stopped(turns: list[Message], calls: list[CallRecord]) -> float:
    """No call of the same tool with the same arguments twice after success (no repeats)."""
    seen: set[str] = set()
    for call in calls:
        key = f"{call.name}:{sorted((call.arguments or {}).items())!r}"
        if call.ok and key in seen:
            return 0.0
        if call.ok:
            seen.add(key)
    return used_tools(turns, calls)


def asked_first(turns: list[Message], calls: list[CallRecord]) -> float:
    """A question to the user before the first tool call."""
    for turn in turns:
        if turn.role != "assistant":
            continue
        if turn.tool_calls:
            return 0.0
        if "?" in (turn.content or ""):
            return 1.0
    return 0.0


CHECKS: dict[str, Check] = {
    "valid_tool_arguments": valid_arguments,
    "well_formed_tool_calls": valid_arguments,
    "use_tools_when_needed": used_tools,
    "use_existing_tools": used_tools,
    "look_up_before_acting": used_tools,
    "recover_from_tool_errors": recovered,
    "avoid_repeating_rejected_calls": recovered,
    "report_result_to_user": reported,
    "stop_after_completion": stopped,
    "ask_for_missing_information": asked_first,
}
