"""Behavioural features of one trajectory: deterministic, and blind to which environment it is.

Features read two things every environment records the same way: the conversation from the
agent's first turn on (`TrajectoryView.agent_part`: a worked example in the episode's opening
is the environment's, not the agent's) and the environment's call records
(`TrajectoryView.calls`).

- A call's outcome is read from the error texts of `shared.envs.tools.ToolBox`, which every
  environment runs its tools through: `unknown tool ...`, `arguments are not valid JSON ...` /
  `arguments must be a JSON object`, `invalid arguments: ...` (the schema); any other failure
  is the tool itself refusing (a `ToolError`).
- A tool is read-only when its name starts with one of `READ_ONLY_PREFIXES` (get_, list_,
  search_, find_, lookup_, check_, read_, calculate, convert); every other tool is taken to
  have a side effect. This is a naming heuristic: a target whose tools are named otherwise
  gets every tool treated as side-effecting, which makes the ordering features conservative.
- "Text to the user" is an assistant message with text and no tool calls (see
  `MessageView.is_text_to_user`): text sent beside tool calls is not shown to the user.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from services.contrast.trajectory import CallView, TrajectoryView

READ_ONLY_PREFIXES = (
    "get_",
    "list_",
    "search_",
    "find_",
    "lookup_",
    "check_",
    "read_",
    "calculate",
    "convert",
)

Outcome = Literal["ok", "unknown_tool", "bad_json", "invalid_arguments", "tool_error"]


def is_read_only(tool: str) -> bool:
    """Whether a tool only reads, judged from its name (see the module docstring)."""
    return tool.lower().startswith(READ_ONLY_PREFIXES)


def outcome(call: CallView) -> Outcome:
    """What happened to one call, from the ToolBox's error texts."""
    if call.ok:
        return "ok"
    error = call.error or ""
    if error.startswith("unknown tool"):
        return "unknown_tool"
    if error.startswith(("arguments are not valid JSON", "arguments must be a JSON object")):
        return "bad_json"
    if error.startswith("invalid arguments"):
        return "invalid_arguments"
    return "tool_error"


@dataclass(frozen=True)
class Features:
    """Counts and flags describing how the agent behaved in one trajectory."""

    assistant_turns: int
    """Assistant messages in the conversation."""
    attempted_calls: int
    """Tool calls the model wrote: parsed ones plus unparsable ones (`tool_call_errors`)."""
    received_calls: int
    """Calls the environment received (parsed calls; each has a call record)."""
    successful_calls: int
    """Received calls that succeeded."""
    well_formed_calls: int
    """Calls that reached a known tool with a JSON object as arguments."""
    unparsed_calls: int
    """Calls so broken the model's output could not be read as a call at all."""
    bad_json_calls: int
    """Calls whose arguments were not a JSON object."""
    unknown_tool_calls: int
    """Calls naming a tool the environment does not have."""
    invalid_argument_calls: int
    """Calls whose arguments broke the tool's schema."""
    tool_errors: int
    """Calls the tool itself refused or failed on (arguments were schema-valid)."""
    recovered_failures: int
    """Tool errors (a known tool refused schema-valid arguments: not found, taken, wrong
    value) followed, later, by a successful call of the same tool."""
    unrecovered_failures: int
    """Tool errors never followed by a successful call of the same tool. Schema rejections
    and unparsable arguments are not counted here: they are the argument capabilities'
    (`invalid_argument_calls`, `bad_json_calls`); counted here too, every call with a bad
    argument would also be an unrecovered error, and recovery would take the place of the
    argument skill it cannot exist without (docs/benchmarks.md, trace_lift's second run)."""
    repeated_rejected_calls: int
    """Calls identical (tool and arguments) to an earlier call rejected by the schema."""
    duplicate_side_effects: int
    """Successful side-effecting calls identical to an earlier successful one."""
    side_effect_calls: int
    """Attempted calls of tools that are not read-only (by name)."""
    question_before_side_effect: bool | None
    """A text to the user containing '?' came before the first side-effecting call;
    None when the agent attempted no side-effecting call."""
    read_only_before_side_effect: bool | None
    """A read-only call was made in an earlier assistant message than the first
    side-effecting call (a lookup in the same message cannot inform it); None without one."""
    reported_after_tools: bool | None
    """The last assistant message is text to the user and comes after the last tool result;
    None when no tool result came back."""
    ended_on_tool_call: bool
    """The last assistant message still carried tool calls: the agent never handed back
    (turn limit or a crash ended the episode)."""

    @property
    def malformed_calls(self) -> int:
        """Calls that were unparsable or had non-object arguments."""
        return self.unparsed_calls + self.bad_json_calls

    @property
    def no_tool_calls(self) -> bool:
        """The agent never attempted a tool call."""
        return self.attempted_calls == 0


def extract(trajectory: TrajectoryView) -> Features:
    """The features of one trajectory (pure: the same trajectory gives the same features)."""
    messages = trajectory.agent_part
    calls = trajectory.calls
    outcomes = [outcome(c) for c in calls]
    assistant = [i for i, m in enumerate(messages) if m.role == "assistant"]
    tool_results = [i for i, m in enumerate(messages) if m.role == "tool"]
    last = messages[assistant[-1]] if assistant else None
    reported = None
    if tool_results:
        reported = bool(last and last.is_text_to_user and assistant[-1] > tool_results[-1])
    asked, looked_up, first_effect = _before_first_side_effect(trajectory)
    recovered, unrecovered = _recovery(calls, outcomes)
    return Features(
        assistant_turns=len(assistant),
        attempted_calls=sum(len(m.tool_calls) + len(m.tool_call_errors) for m in messages),
        received_calls=len(calls),
        successful_calls=outcomes.count("ok"),
        well_formed_calls=sum(o not in ("unknown_tool", "bad_json") for o in outcomes),
        unparsed_calls=sum(len(m.tool_call_errors) for m in messages),
        bad_json_calls=outcomes.count("bad_json"),
        unknown_tool_calls=outcomes.count("unknown_tool"),
        invalid_argument_calls=outcomes.count("invalid_arguments"),
        tool_errors=outcomes.count("tool_error"),
        recovered_failures=recovered,
        unrecovered_failures=unrecovered,
        repeated_rejected_calls=_repeats(calls, outcomes),
        duplicate_side_effects=_duplicate_side_effects(calls),
        side_effect_calls=sum(not is_read_only(c.name) for m in messages for c in m.tool_calls),
        question_before_side_effect=asked if first_effect else None,
        read_only_before_side_effect=looked_up if first_effect else None,
        reported_after_tools=reported,
        ended_on_tool_call=bool(last and (last.tool_calls or last.tool_call_errors)),
    )


def _before_first_side_effect(trajectory: TrajectoryView) -> tuple[bool, bool, bool]:
    """(asked a question, made a read-only call, a side effect was attempted at all)."""
    asked = looked_up = False
    for message in trajectory.agent_part:
        if message.is_text_to_user and "?" in (message.content or ""):
            asked = True
        names = [c.name for c in message.tool_calls]
        if any(not is_read_only(n) for n in names):
            return asked, looked_up, True
        looked_up = looked_up or bool(names)
    return asked, looked_up, False


def _recovery(calls: tuple[CallView, ...], outcomes: list[Outcome]) -> tuple[int, int]:
    """Tool errors, split by whether the same tool later succeeded."""
    recovered = unrecovered = 0
    for i, call in enumerate(calls):
        if outcomes[i] != "tool_error":
            continue
        if any(later.ok and later.name == call.name for later in calls[i + 1 :]):
            recovered += 1
        else:
            unrecovered += 1
    return recovered, unrecovered


def _key(call: CallView) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, default=str)


def _repeats(calls: tuple[CallView, ...], outcomes: list[Outcome]) -> int:
    rejected: set[str] = set()
    repeats = 0
    for call, result in zip(calls, outcomes, strict=True):
        key = _key(call)
        if call.arguments is not None and key in rejected:
            repeats += 1
        if result == "invalid_arguments":
            rejected.add(key)
    return repeats


def _duplicate_side_effects(calls: tuple[CallView, ...]) -> int:
    done: set[str] = set()
    duplicates = 0
    for call in calls:
        if not call.ok or is_read_only(call.name):
            continue
        key = _key(call)
        duplicates += key in done
        done.add(key)
    return duplicates
