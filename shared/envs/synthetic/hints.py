"""The deterministic hint of a synthetic task: built from its spec (the capability, the needed
tools' schemas, the writer's hints) and the task's own state (a withheld detail, an injected
failure, a value to report). It names what to attend to, never the values of the solution."""

from __future__ import annotations

from typing import Any

from shared.envs.synthetic.spec import SyntheticSpec
from shared.envs.synthetic.target import schema_of

CALL_FORMAT = (
    'To call a tool, write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call> '
    "and nothing else in that message."
)


def task_hint(spec: SyntheticSpec, data: dict[str, Any]) -> str:
    lines = []
    if spec.capability.definition:
        lines.append(f"This task tests one skill: {spec.capability.definition.strip()}")
    needed = [name for name in spec.offered("needed") if name in data.get("tools", [])]
    if needed:
        lines.append("The tools that matter here: " + ", ".join(needed) + ".")
    for name in needed:
        lines.extend(_argument_notes(name))
    optional = [note for name in needed if (note := _optional_note(name))]
    if optional:
        lines.append(
            "Give only the arguments the request or a tool's answer gives you values for; "
            "leave out optional ones you have no value for (" + "; ".join(optional) + ") "
            "rather than make values up."
        )
    if data.get("withheld"):
        lines.append(
            "The request leaves out a detail you need: ask the user for it before acting, "
            "and do not guess it."
        )
    if data.get("faults"):
        lines.append(
            "A tool may fail with a temporary error: read it, and make the same call again."
        )
    if data.get("values"):
        lines.append("When you are done, tell the user the outcome, naming the result.")
    lines.extend(h.strip() for h in (spec.template.hints if spec.template else ()) if h.strip())
    lines.append(CALL_FORMAT)
    return "\n".join(f"- {line}" for line in lines)


FORM_WORDS = ("HH:MM", "YYYY", "format", "e.g.", "ISO")


def _optional_note(tool: str) -> str:
    """`tool: a, b`: the tool's arguments that are not required (empty when none)."""
    try:
        params = schema_of(tool)["function"].get("parameters") or {}
    except KeyError:
        return ""
    required = set(params.get("required") or ())
    optional = [arg for arg in params.get("properties") or {} if arg not in required]
    return f"`{tool}`: " + ", ".join(f"`{arg}`" for arg in optional) if optional else ""


def _argument_notes(tool: str) -> list[str]:
    """What the tool's own schema says about the form its arguments take."""
    try:
        params = schema_of(tool)["function"].get("parameters") or {}
    except KeyError:
        return []
    notes = []
    for arg, prop in (params.get("properties") or {}).items():
        description = str(prop.get("description") or "").strip().rstrip(".")
        if any(word in description for word in FORM_WORDS):
            notes.append(f"`{tool}` takes `{arg}` as: {description}.")
    return notes
