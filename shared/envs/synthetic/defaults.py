"""The default spec for a capability: its scenario family, tools, knobs and checks.

Contrast's catalogue names map to a family directly (a few also reweight the family's checks
towards what they name); any other capability is matched to the nearest catalogue name by
keywords in its name (counted twice) and definition, with a multi-step family as fallback.
"""

from __future__ import annotations

import re

from shared.envs.synthetic.families import FAMILIES
from shared.envs.synthetic.spec import (
    Capability,
    CheckSpec,
    Knobs,
    ScenarioTemplate,
    SyntheticSpec,
    ToolRef,
    ToolRole,
)
from shared.envs.synthetic.target import schema_of, tool_order
from shared.envs.synthetic.template import TEMPLATE, template_family

CAPABILITY_FAMILIES: dict[str, str] = {
    "valid_tool_arguments": "set_alarm_at_time",
    "well_formed_tool_calls": "set_alarm_at_time",
    "avoid_repeating_rejected_calls": "set_alarm_at_time",
    "use_existing_tools": "send_message_to_contact",
    "stop_after_completion": "send_message_to_contact",
    "recover_from_tool_errors": "recover_from_rejected_call",
    "ask_for_missing_information": "reminder_with_missing_detail",
    "report_result_to_user": "convert_and_report",
    "use_tools_when_needed": "convert_and_report",
    "look_up_before_acting": "look_up_contact_then_message",
}
"""Contrast's catalogue (services/contrast/deterministic.py) -> the family isolating it."""

CAPABILITY_CHECKS: dict[str, tuple[CheckSpec, ...]] = {
    "avoid_repeating_rejected_calls": (
        CheckSpec(kind="called_tool", weight=0.4, tool="set_alarm", keys=["time", "label"]),
        CheckSpec(kind="no_repeated_rejection", weight=0.3),
        CheckSpec(kind="reply_mentions", weight=0.2, value="time"),
        CheckSpec(kind="no_forbidden_side_effect", weight=0.1),
    ),
    "stop_after_completion": (
        CheckSpec(
            kind="called_tool", weight=0.4, tool="send_message", keys=["phone_number", "body"]
        ),
        CheckSpec(kind="stopped_after_done", weight=0.4),
        CheckSpec(kind="reply_mentions", weight=0.2, value="recipient"),
    ),
}
"""Capabilities whose family's default checks would not reward what they name."""

KEYWORDS: dict[str, tuple[str, ...]] = {
    "recover_from_tool_errors": ("error", "retry", "retries", "fail", "recover"),
    "ask_for_missing_information": (
        "ask", "clarif", "missing", "ambigu", "withh", "underspecif", "incomplete", "question",
    ),
    "look_up_before_acting": (
        "look up", "look_up", "lookup", "search", "verify", "check first", "before acting",
    ),
    "report_result_to_user": ("report", "tell", "answer", "result", "summar", "inform"),
    "stop_after_completion": ("stop", "duplicate", "twice", "loop", "complet"),
    "avoid_repeating_rejected_calls": ("repeat", "same call", "identical", "reject"),
    "use_existing_tools": ("exist", "invent", "hallucinat", "unknown tool", "phone", "message"),
    "well_formed_tool_calls": ("json", "parse", "well formed", "malformed", "syntax"),
    "use_tools_when_needed": ("use tool", "use the tool", "memory", "convert", "currenc"),
    "valid_tool_arguments": ("argument", "format", "schema", "parameter", "valid", "type"),
}  # fmt: skip
"""catalogue name -> word stems pointing to it (matched at a word start, case-insensitive);
ties go to the earlier entry."""

FALLBACK = "look_up_contact_then_message"


def nearest_capability(capability_name: str, definition: str = "") -> str | None:
    """The catalogue name the capability is, or resembles most; None when nothing matches."""
    key = capability_name.strip().lower()
    if key in CAPABILITY_FAMILIES:
        return key
    name = re.sub(r"[_\-]+", " ", key)
    text = definition.lower()

    def hits(stem: str, where: str) -> int:
        return len(re.findall(rf"\b{re.escape(stem)}", where))

    scores = {
        known: sum(2 * hits(stem, name) + hits(stem, text) for stem in stems)
        for known, stems in KEYWORDS.items()
    }
    best = max(scores, key=lambda known: scores[known])
    return best if scores[best] > 0 else None


def family_for(capability_name: str, definition: str = "") -> str:
    """The scenario family that best isolates the capability."""
    known = nearest_capability(capability_name, definition)
    return CAPABILITY_FAMILIES[known] if known else FALLBACK


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:80] or "capability"


def default_spec(capability_name: str, definition: str = "") -> SyntheticSpec:
    """The spec of the family that best isolates the capability, with its defaults."""
    known = nearest_capability(capability_name, definition)
    family = CAPABILITY_FAMILIES[known] if known else FALLBACK
    checks = CAPABILITY_CHECKS.get(known or "")
    return family_spec(family, capability_name, definition, checks)


def family_spec(
    scenario: str,
    capability_name: str,
    definition: str = "",
    checks: tuple[CheckSpec, ...] | None = None,
) -> SyntheticSpec:
    """A spec running `scenario` with its family's tools and knobs, and its checks unless
    `checks` are given."""
    family = FAMILIES[scenario]
    tools = [ToolRef(name=n, role="needed", schema=schema_of(n)) for n in family.needed]
    tools += [ToolRef(name=n, role="distractor", schema=schema_of(n)) for n in family.distractors]
    return SyntheticSpec(
        name=slug(capability_name),
        capability=Capability(name=capability_name, definition=definition),
        scenario=family.name,
        tools=tools,
        knobs=family.knobs,
        checks=list(checks if checks is not None else family.checks),
    )


TEMPLATE_DISTRACTORS = 4
"""Distractor tools a template spec lists when none are named."""


def template_spec(
    capability_name: str,
    definition: str,
    template: ScenarioTemplate,
    checks: list[CheckSpec] | None = None,
    distractors: list[str] | None = None,
) -> SyntheticSpec:
    """A spec running `template`: the tools its calls use as needed, distractors beside them
    (by default the target's tools sharing a word with a needed one, then the first others),
    and `checks` or the template's default ones."""
    family = template_family(template)
    needed = list(family.needed)
    if distractors is None:
        words = {w for name in needed for w in name.split("_")}
        others = [n for n in tool_order() if n not in needed]
        related = [n for n in others if words & set(n.split("_"))]
        distractors = [*related, *(n for n in others if n not in related)][:TEMPLATE_DISTRACTORS]
    known = set(tool_order())

    def ref(name: str, role: ToolRole) -> ToolRef:
        # an unknown tool keeps an empty schema: validation names it, it does not crash here
        return ToolRef(name=name, role=role, schema=schema_of(name) if name in known else {})

    tools = [ref(n, "needed") for n in needed]
    tools += [ref(n, "distractor") for n in distractors if n not in needed]
    return SyntheticSpec(
        name=slug(capability_name),
        capability=Capability(name=capability_name, definition=definition),
        scenario=TEMPLATE,
        tools=tools,
        knobs=Knobs(distractor_tools=min(2, len(tools) - len(needed))),
        checks=list(checks) if checks else list(family.checks),
        template=template,
    )
