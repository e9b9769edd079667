"""The spec writer's prompts: the template format, one worked example, the target's tools."""

from __future__ import annotations

from collections.abc import Sequence
from string import Template
from typing import Any

SYSTEM = """\
You design training environments for a tool-using assistant. Each environment isolates one
capability the assistant lacks: a family of small tasks that can only be solved by exercising
that capability, with a reward that checks it was exercised.

Write the environment as ONE JSON object with two keys, "template" and "checks".

"template" describes how each task is generated from a random seed:
- "slots": named values drawn per task. Kinds:
  {"kind": "contact", "relation": "sister"}   a person added to the user's contacts
                                            (fields: name, first, phone, email, relation)
  {"kind": "choice", "options": ["a", "b", ...]}   one of at least two options
  {"kind": "integer", "low": 1, "high": 50}   a whole number in the range
  {"kind": "clock"}                           a time of day as HH:MM
- "requests": phrasings of what the user asks; one is drawn per task.
- "calls": the correct tool calls in order (a reference solution). "arguments" give each
  argument's value; "expect" names the arguments a correct call must match and how
  ("eq" same text, "has" every word, "phone" same number, "clock" same time, "number" same
  number). The LAST call must expect at least one argument.
- "reply": what the assistant finally tells the user.
- "values": name -> text the final reply must contain.
- "hints": 1 to 3 short pieces of guidance for the assistant that point at what the
  capability needs ("Find the person's number with search_contacts before texting"), never
  at a task's own values: no {slot} in a hint.
Texts and argument values refer to slots as {slot} or {slot.field}. Use only the tools listed,
with their exact argument names. Make the request need the capability: e.g. for looking
things up first, leave out the detail the lookup finds.

"checks" is the reward: weighted sub-checks whose weights sum to 1. Kinds:
  called_tool (tool, keys: the expected arguments that must match), looked_up_first (tool,
  before), reply_mentions (value), no_forbidden_side_effect, no_invalid_arguments,
  retried_after_error (tool), asked_before_acting, no_repeated_rejection, stopped_after_done.
Give partial credit: 3 or 4 checks, so a half-right attempt earns part of the reward.

Reply with the JSON object only."""

EXAMPLE = """\
Example, for the capability look_up_before_acting ("searches contacts for the number
before texting someone named by first name"):
{"template": {
  "slots": {"person": {"kind": "contact", "relation": "coworker"},
            "note": {"kind": "choice", "options": ["running late", "meeting moved", "call me"]}},
  "requests": ["Text {person.first}: {note}.", "Send {person.first} a message saying {note}."],
  "calls": [
    {"tool": "search_contacts", "arguments": {"query": "{person.first}"}},
    {"tool": "send_message", "arguments": {"phone_number": "{person.phone}", "body": "{note}"},
     "expect": {"phone_number": "phone", "body": "has"}}],
  "reply": "I texted {person.name}: {note}.",
  "values": {"recipient": "{person.first}"},
  "hints": ["You only know the person's first name: look their number up first."]},
 "checks": [
  {"kind": "looked_up_first", "weight": 0.3, "tool": "search_contacts", "before": "send_message"},
  {"kind": "called_tool", "weight": 0.4, "tool": "send_message", "keys": ["phone_number", "body"]},
  {"kind": "no_forbidden_side_effect", "weight": 0.2},
  {"kind": "reply_mentions", "weight": 0.1, "value": "recipient"}]}"""

USER = Template("""\
Capability: $name
Definition: $definition

$evidence
Tools of the target environment (name(arguments) - description):
$tools

Write the environment for this capability as the JSON object described.""")


def signature(schema: dict[str, Any]) -> str:
    """`name(arg: type, opt?: type) - description` of one OpenAI tool schema."""
    function = schema["function"]
    params = function.get("parameters", {})
    required = set(params.get("required", []))
    args = ", ".join(
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
        for name, spec in params.get("properties", {}).items()
    )
    return f"{function['name']}({args}) - {function.get('description', '').strip()}"


def user_prompt(
    name: str, definition: str, evidence: Sequence[str], schemas: Sequence[dict[str, Any]]
) -> str:
    shown = (
        "Where the assistant failed (excerpts):\n" + "\n".join(f"- {e}" for e in evidence) + "\n"
        if evidence
        else ""
    )
    return USER.substitute(
        name=name,
        definition=definition or "(none given)",
        evidence=shown,
        tools="\n".join(signature(s) for s in schemas),
    )
