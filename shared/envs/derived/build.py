"""The default derived spec for a capability of a plug-in target (see spec.py)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from shared.envs.derived.checks import CHECKS
from shared.envs.derived.spec import DerivedSpec
from shared.envs.synthetic.spec import Capability

MAX_TASKS = 8
HINTS: dict[str, list[str]] = {
    "valid_tool_arguments": [
        "Before each call, reread the tool's parameters: send only the arguments it declares, "
        "every required one, each in the type and format its description asks for.",
    ],
    "use_tools_when_needed": [
        "Look the facts up with the tools before you answer or act; do not answer from memory.",
    ],
    "recover_from_tool_errors": [
        "When a tool refuses a call, read its error, fix what it names and call again.",
    ],
    "report_result_to_user": [
        "When the work is done, tell the user in one sentence what you did or found.",
    ],
    "stop_after_completion": [
        "Once the request is done, stop calling tools and tell the user it is done.",
    ],
    "ask_for_missing_information": [
        "If the request leaves out something you need, ask the user for it before acting.",
    ],
}


def derived_spec(
    target: str,
    capability: str,
    definition: str,
    failed_tasks: list[str],
    train_tasks: list[str],
    *,
    hint_share: float = 0.0,
) -> DerivedSpec:
    """A spec replaying the target tasks the capability failed on (else the first train tasks),
    graded with the capability's check when the catalogue has one."""
    chosen = list(dict.fromkeys(t for t in failed_tasks if t in set(train_tasks)))[:MAX_TASKS]
    if not chosen:
        chosen = train_tasks[:MAX_TASKS]
    check = capability if capability in CHECKS else None
    hints = HINTS.get(capability) or [
        f"Keep this in mind: {definition.strip() or capability.replace('_', ' ')}."
    ]
    slug = re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")[:40]
    return DerivedSpec(
        name=f"{capability}-on-{slug}",
        target=target,
        capability=Capability(name=capability, definition=definition),
        task_ids=chosen,
        check=check,
        hints=hints,
        hint_share=hint_share,
    )


def adjust_derived(spec: DerivedSpec, too_hard: bool, max_hint_share: float) -> DerivedSpec | None:
    """One step easier (more hinted rollouts, then more weight on the capability check) or
    harder (fewer hints, then more weight on the target's own reward), revision bumped; None
    when no setting can move (the blend means nothing without a check, and weights stop at
    0.2 and 0.8), so calibration stops instead of judging the same environment again."""
    changes: dict[str, Any] = {}
    if too_hard and spec.hint_share < max_hint_share:
        changes = {"hint_share": round(min(max_hint_share, spec.hint_share + 0.25), 4)}
    elif not too_hard and spec.hint_share > 0:
        changes = {"hint_share": round(max(0.0, spec.hint_share - 0.25), 4)}
    elif spec.check is not None:
        weight = (
            min(0.8, spec.check_weight + 0.15) if too_hard else max(0.2, spec.check_weight - 0.15)
        )
        if round(weight, 4) != spec.check_weight:
            changes = {"check_weight": round(weight, 4)}
    if not changes:
        return None
    return msgspec.structs.replace(spec, revision=spec.revision + 1, **changes)
