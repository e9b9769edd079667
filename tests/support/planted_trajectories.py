"""Trajectories in the stored shape, written by hand (`Script`) or planted in bulk (`planted`).

`planted` makes a data set whose failures have a known cause: schema-invalid arguments in a
chosen share of failures and a much smaller share of successes, while a noise behaviour
(asking the user a question first) is equally common in both. Contrast must find the first
and reject the second. Counts are exact (not sampled), so expected rates are known.
"""

from __future__ import annotations

import json
import random
from typing import Any, Literal

from services.contrast.trajectory import TrajectoryView

CallKind = Literal["ok", "invalid", "unknown", "bad_json", "fail"]


class Script:
    """Builds one episode's `messages` and call records the way the runner stores them."""

    def __init__(self, request: str = "Please set item 1.") -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": request},
        ]
        self.calls: list[dict[str, Any]] = []

    def say(self, text: str) -> Script:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def user(self, text: str) -> Script:
        self.messages.append({"role": "user", "content": text})
        return self

    def call(self, name: str, arguments: dict[str, Any], kind: CallKind = "ok") -> Script:
        """One assistant message with one tool call, then its tool result."""
        call_id = f"call_{len(self.messages)}"
        text = "{not json" if kind == "bad_json" else json.dumps(arguments)
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": text},
                    }
                ],
            }
        )
        error = {
            "ok": None,
            "invalid": "invalid arguments: id: 'x' is not of type 'integer'",
            "unknown": f"unknown tool {name!r}; available: get_item, set_item",
            "bad_json": "arguments are not valid JSON: Expecting property name",
            "fail": "service temporarily unavailable",
        }[kind]
        parsed = kind in ("ok", "invalid", "fail")
        self.calls.append(
            {
                "name": name,
                "arguments": arguments if parsed else None,
                "ok": kind == "ok",
                "error": error,
            }
        )
        body = {"error": error} if error else {"result": "ok"}
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": json.dumps(body)}
        )
        return self

    def broken(self, raw: str = '<tool_call>{"name": "set_item"') -> Script:
        """An assistant message whose tool call could not be parsed."""
        self.messages.append(
            {
                "role": "assistant",
                "content": raw,
                "tool_call_errors": [f"unterminated <tool_call> block: {raw}"],
            }
        )
        return self

    def stored(self, id: str, success: bool, kind: str = "planted") -> dict[str, Any]:
        """The fields `TrajectoryView.from_stored` takes, as the store holds them."""
        return {
            "id": id,
            "task_id": f"{kind}-{id}",
            "task_kind": kind,
            "success": success,
            "reward": 1.0 if success else 0.0,
            "messages": self.messages,
            "reward_breakdown": {
                "checks": {},
                "notes": [],
                "turns": sum(m["role"] == "assistant" for m in self.messages),
                "error": None,
                "calls": self.calls,
            },
        }

    def view(self, id: str, success: bool, kind: str = "planted") -> TrajectoryView:
        return TrajectoryView.from_stored(**self.stored(id, success, kind))


def episode(*, cause: bool, asks: bool) -> Script:
    """Look up, act and report; `cause` adds a schema-rejected (then fixed) call and `asks`
    a question to the user before acting."""
    script = Script()
    if asks:
        script.say("Which item do you mean?").user("Item 1.")
    script.call("get_item", {"id": 1})
    if cause:
        script.call("set_item", {"id": "x"}, "invalid")
    return script.call("set_item", {"id": 1}).say("Done: item 1 is set.")


def planted(
    *,
    failed: int = 40,
    succeeded: int = 40,
    cause_in_failed: float = 0.8,
    cause_in_succeeded: float = 0.1,
    asks: float = 0.5,
    seed: int = 0,
) -> list[TrajectoryView]:
    """`failed` + `succeeded` trajectories with exact shares of the cause and the noise,
    independent of each other; the order is shuffled with `seed`."""
    rng = random.Random(seed)
    out: list[TrajectoryView] = []
    for success, n, share in (
        (False, failed, cause_in_failed),
        (True, succeeded, cause_in_succeeded),
    ):
        causes = _flags(n, share, rng)
        noise = _flags(n, asks, rng)
        for i in range(n):
            tid = f"{'ok' if success else 'fail'}-{i:03d}"
            out.append(episode(cause=causes[i], asks=noise[i]).view(tid, success))
    rng.shuffle(out)
    return out


def _flags(n: int, share: float, rng: random.Random) -> list[bool]:
    k = round(n * share)
    flags = [True] * k + [False] * (n - k)
    rng.shuffle(flags)
    return flags
