"""The check vocabulary synthetic rewards are written in, over one episode's trace.

Each kind reads a `CheckSpec` (its `tool`, `keys`, `value`, `before`) and the task's generated
data (expected arguments, reply values, excused errors, forbidden actions):

- `called_tool`: a successful call of `tool` whose `keys` arguments carry the expected values.
- `no_invalid_arguments`: something succeeded, and no call failed except through an injected
  outage or an error the scenario itself provokes (bad JSON, schema, format all count).
- `asked_before_acting`: when a detail was withheld, the user supplied it before any change;
  when none was, the agent acted (a needless question ends the conversation).
- `retried_after_error`: `tool` was called and its last call succeeded (it did not give up).
- `reply_mentions`: something succeeded, and an assistant text names the scenario's `value`
  (a reply that names it without any successful call claims what was never done).
- `no_forbidden_side_effect`: the agent changed something, and none of the task's forbidden
  actions happened (texting someone else, deleting, completing or changing what was not asked).
- `looked_up_first`: a successful `tool` call came before the first call of `before`.
- `no_repeated_rejection`: something succeeded, and no call the agent got wrong was sent
  again with the very same arguments.
- `stopped_after_done`: the agent changed something, made no successful change twice with the
  same arguments, and the episode ends on its text to the user (not mid tool use).

Restraint checks hold only once the agent did something (a successful call; for side effects,
a successful change): doing nothing is not restraint. Nor is a report a report of nothing:
in the second trace_lift run, Qwen's text-only replies that named the fallback time earned
`reply_mentions` in half the calibration episodes of an environment whose GRPO groups then
scored 0 (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.envs.synthetic.matchers import argument_matches, reply_matches
from shared.envs.synthetic.spec import CheckSpec
from shared.envs.toolbox import checks as toolbox_checks
from shared.envs.toolbox.checks import Trace
from shared.envs.toolbox.tools import MUTATING
from shared.envs.tools import CallRecord


@dataclass(frozen=True)
class Context:
    trace: Trace
    data: dict[str, Any]
    """The task's data (see tasks.py)."""

    @property
    def calls(self) -> list[CallRecord]:
        return self.trace.calls

    def engaged(self) -> bool:
        return any(c.ok for c in self.calls)

    def excused(self, record: CallRecord) -> bool:
        texts = [f["error"] for f in self.data["faults"]] + list(self.data["excused"])
        return any(text in (record.error or "") for text in texts)


def called_tool(ctx: Context, check: CheckSpec) -> bool:
    expected = ctx.data["expected"][check.tool]
    return any(
        c.ok
        and c.name == check.tool
        and c.arguments is not None
        and all(argument_matches(expected[key], c.arguments.get(key)) for key in check.keys)
        for c in ctx.calls
    )


def no_invalid_arguments(ctx: Context, check: CheckSpec) -> bool:
    return ctx.engaged() and all(c.ok or ctx.excused(c) for c in ctx.calls)


def asked_before_acting(ctx: Context, check: CheckSpec) -> bool:
    if ctx.data["withheld"]:
        return toolbox_checks.asked_first(ctx.trace)
    return toolbox_checks.any_side_effect(ctx.trace)


def retried_after_error(ctx: Context, check: CheckSpec) -> bool:
    mine = [c for c in ctx.calls if c.name == check.tool]
    return bool(mine) and mine[-1].ok


def reply_mentions(ctx: Context, check: CheckSpec) -> bool:
    return ctx.engaged() and reply_matches(ctx.data["values"][check.value], ctx.trace)


def no_forbidden_side_effect(ctx: Context, check: CheckSpec) -> bool:
    broken = (
        toolbox_checks.CHECKS[rule["check"]](ctx.trace, **rule.get("args", {}))
        for rule in ctx.data["forbidden"]
    )
    return toolbox_checks.any_side_effect(ctx.trace) and not any(broken)


def looked_up_first(ctx: Context, check: CheckSpec) -> bool:
    for record in ctx.calls:
        if record.name == check.before:
            return False
        if record.name == check.tool and record.ok:
            return True
    return False


def no_repeated_rejection(ctx: Context, check: CheckSpec) -> bool:
    rejected = [_key(c) for c in ctx.calls if not c.ok and not ctx.excused(c)]
    return ctx.engaged() and len(set(rejected)) == len(rejected)


def stopped_after_done(ctx: Context, check: CheckSpec) -> bool:
    changes = [_key(c) for c in ctx.calls if c.ok and c.name in MUTATING]
    steps = ctx.trace.transcript[ctx.trace.opening :]
    last = steps[-1] if steps else None
    closed = last is not None and last.role == "assistant" and not last.tool_calls
    return bool(changes) and len(set(changes)) == len(changes) and closed


def _key(record: CallRecord) -> str:
    return json.dumps([record.name, record.arguments], sort_keys=True, default=str)


CHECK_KINDS: dict[str, Callable[[Context, CheckSpec], bool]] = {
    fn.__name__: fn
    for fn in (
        called_tool,
        no_invalid_arguments,
        asked_before_acting,
        retried_after_error,
        reply_mentions,
        no_forbidden_side_effect,
        looked_up_first,
        no_repeated_rejection,
        stopped_after_done,
    )
}

CHECK_FIELDS: dict[str, tuple[str, ...]] = {
    "called_tool": ("tool", "keys"),
    "retried_after_error": ("tool",),
    "reply_mentions": ("value",),
    "looked_up_first": ("tool", "before"),
}
"""The `CheckSpec` fields each kind needs (kinds not listed need none)."""
