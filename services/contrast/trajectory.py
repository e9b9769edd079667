"""TrajectoryView: one stored trajectory, checked and typed, as contrast reads it.

Stored trajectories are JSON written by the rollout service (`messages`, `reward_breakdown`,
`success`, `reward`, plus the task's external id and kind). `TrajectoryView.from_stored`
checks that shape once and raises `MalformedTrajectoryError` (a `ValueError`) naming the
trajectory and the offending path, so a bad row is reported where it is read instead of
surfacing later as a `KeyError` deep inside a labeller.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


class MalformedTrajectoryError(ValueError):
    """A stored trajectory does not have the shape contrast needs; the message says where."""


@dataclass(frozen=True)
class ToolCallView:
    """One tool call as the model wrote it (OpenAI `tool_calls` entry)."""

    id: str
    name: str
    arguments: str
    """JSON text as the model produced it; it may not parse (the call record says)."""


@dataclass(frozen=True)
class MessageView:
    """One chat message in OpenAI's shape."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCallView, ...] = ()
    tool_call_errors: tuple[str, ...] = ()
    """Tool calls the model wrote that could not be parsed (assistant messages only)."""
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def is_text_to_user(self) -> bool:
        """An assistant message the user sees as text: content, no calls, nothing broken.

        A message with unparsable calls is excluded because its text holds the broken call."""
        return (
            self.role == "assistant"
            and bool((self.content or "").strip())
            and not self.tool_calls
            and not self.tool_call_errors
        )


@dataclass(frozen=True)
class CallView:
    """What the environment did with one tool call it received, in order."""

    name: str
    arguments: Mapping[str, Any] | None
    """The parsed arguments object; None when they never parsed (or the tool is unknown)."""
    ok: bool
    error: str | None


@dataclass(frozen=True)
class TrajectoryView:
    """A graded episode: the conversation, the environment's call records and the outcome."""

    id: str
    task_id: str
    """The task's external id in its environment, e.g. `multi_step-0003`."""
    task_kind: str
    success: bool
    reward: float
    messages: tuple[MessageView, ...]
    calls: tuple[CallView, ...]
    error: str | None = None
    """Why the episode stopped early (a failed model call, a broken environment), if it did."""
    opening: int = 0
    """Leading messages the environment wrote, not the agent: the system turn and the
    episode's first messages, which may hold a worked example with its own tool calls."""

    @property
    def agent_part(self) -> tuple[MessageView, ...]:
        """The conversation from the agent's first turn on: what its features are read from."""
        return self.messages[self.opening :]

    @classmethod
    def from_stored(
        cls,
        *,
        id: object,
        task_id: object,
        task_kind: object,
        success: object,
        reward: object,
        messages: object,
        reward_breakdown: object,
    ) -> TrajectoryView:
        """Check and convert the stored fields; raise `MalformedTrajectoryError` if bad."""
        tid = _ident(id, "id", "trajectory (no id)")
        where = f"trajectory {tid}"
        if not isinstance(success, bool):
            raise MalformedTrajectoryError(
                f"{where}: success must be true or false, got {success!r} "
                "(only graded trajectories can be contrasted)"
            )
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise MalformedTrajectoryError(f"{where}: reward must be a number, got {reward!r}")
        if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise MalformedTrajectoryError(f"{where}: reward must be in [0, 1], got {reward!r}")
        if not isinstance(messages, list) or not messages:
            raise MalformedTrajectoryError(f"{where}: messages must be a non-empty list")
        if not isinstance(reward_breakdown, Mapping):
            raise MalformedTrajectoryError(f"{where}: reward_breakdown must be an object")
        calls = reward_breakdown.get("calls")
        if not isinstance(calls, list):
            raise MalformedTrajectoryError(
                f"{where}: reward_breakdown.calls must be a list of call records, got {calls!r}"
            )
        error = reward_breakdown.get("error")
        opening = reward_breakdown.get("opening", 0)
        if (
            isinstance(opening, bool)
            or not isinstance(opening, int)
            or not 0 <= opening <= len(messages)
        ):
            raise MalformedTrajectoryError(
                f"{where}: reward_breakdown.opening must be a count of leading messages between "
                f"0 and {len(messages)}, got {opening!r}"
            )
        return cls(
            id=tid,
            task_id=_ident(task_id, "task_id", where),
            task_kind=_text(task_kind, "task_kind", where),
            success=success,
            reward=float(reward),
            messages=tuple(_message(m, f"{where}: messages[{i}]") for i, m in enumerate(messages)),
            calls=tuple(
                _call(c, f"{where}: reward_breakdown.calls[{i}]") for i, c in enumerate(calls)
            ),
            error=_optional_text(error, "reward_breakdown.error", where),
            opening=opening,
        )


def _ident(value: object, field: str, where: str) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str) and value:
        return value
    raise MalformedTrajectoryError(f"{where}: {field} must be a non-empty string, got {value!r}")


def _text(value: object, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedTrajectoryError(f"{where}: {field} must be a string, got {value!r}")
    return value


def _optional_text(value: object, field: str, where: str) -> str | None:
    return None if value is None else _text(value, field, where)


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise MalformedTrajectoryError(f"{where} must be an object, got {value!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedTrajectoryError(f"{where} must be a list, got {value!r}")
    return value


def _message(raw: object, where: str) -> MessageView:
    msg = _object(raw, where)
    role = msg.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise MalformedTrajectoryError(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}")
    tool_calls = _list(msg.get("tool_calls"), f"{where}.tool_calls")
    errors = _list(msg.get("tool_call_errors"), f"{where}.tool_call_errors")
    if (tool_calls or errors) and role != "assistant":
        raise MalformedTrajectoryError(f"{where}: only assistant messages carry tool calls")
    return MessageView(
        role=cast(Role, role),
        content=_content(msg.get("content"), f"{where}.content"),
        tool_calls=tuple(
            _tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(tool_calls)
        ),
        tool_call_errors=tuple(
            _text(e, f"tool_call_errors[{i}]", where) for i, e in enumerate(errors)
        ),
        tool_call_id=_optional_text(msg.get("tool_call_id"), "tool_call_id", where),
        name=_optional_text(msg.get("name"), "name", where),
    )


def _content(value: object, where: str) -> str | None:
    """A string, null, or OpenAI content parts (their text parts joined)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [_object(p, f"{where}[{i}]") for i, p in enumerate(value)]
        return "\n".join(str(p["text"]) for p in parts if p.get("type") == "text" and "text" in p)
    raise MalformedTrajectoryError(f"{where} must be a string, null or a list of parts")


def _tool_call(raw: object, where: str) -> ToolCallView:
    call = _object(raw, where)
    function = _object(call.get("function"), f"{where}.function")
    return ToolCallView(
        id=_text(call.get("id", ""), "id", where),
        name=_text(function.get("name"), "function.name", where),
        arguments=_text(function.get("arguments"), "function.arguments", where),
    )


def _call(raw: object, where: str) -> CallView:
    record = _object(raw, where)
    arguments = record.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        raise MalformedTrajectoryError(f"{where}.arguments must be an object or null")
    ok = record.get("ok")
    if not isinstance(ok, bool):
        raise MalformedTrajectoryError(f"{where}.ok must be true or false, got {ok!r}")
    return CallView(
        name=_text(record.get("name"), "name", where),
        arguments=arguments,
        ok=ok,
        error=_optional_text(record.get("error"), "error", where),
    )
