"""Scenario templates: a scenario family written as data, e.g. by an LLM.

A spec whose `scenario` is `template` carries a `ScenarioTemplate`: named slots drawn from
the seed (a contact put into the world, a choice, an integer, a clock time), request
phrasings, the reference tool calls with their arguments (which arguments a correct call
must match, and how), the reference closing reply, and the reply values checks can ask
for. Text fields refer to slots as `{slot}` or `{slot.field}`; an argument that is exactly
one placeholder keeps the slot's type (an integer stays an integer).

`template_family(t)` turns a template into a `Family`, so the rest of the interpreter
(tasks, checks, calibration knobs, determinism) treats it like a hand-written one.
`template_problems(t)` lists what is wrong with a template before anything runs; what only
running can show (arguments a tool rejects, a reference that does not score 1.0) is found
by `check_deterministic`, which replays the reference on several seeds.
"""

from __future__ import annotations

import re
from typing import Any

from shared.envs.synthetic import matchers as m
from shared.envs.synthetic.scenario import Family, Scenario
from shared.envs.synthetic.spec import CheckSpec, Knobs, MatchKind, ScenarioTemplate, Slot
from shared.envs.toolbox.comms import normalize_phone
from shared.envs.toolbox.tools import MUTATING

TEMPLATE = "template"
"""The `scenario` of a spec that carries its own template."""

SLOT_FIELDS: dict[str, tuple[str, ...]] = {
    "contact": ("name", "first", "phone", "email", "relation"),
    "choice": (),
    "integer": (),
    "clock": (),
}
"""slot kind -> the fields `{slot.field}` may name (`{slot}` alone: a contact's full name)."""

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_REF = re.compile(r"^([a-z][a-z0-9_]*)(?:\.([a-z_]+))?$")
_IDENT = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
MINUTES = (0, 10, 15, 20, 30, 40, 45, 50)
MAX_SLOTS = 8
MAX_CALLS = 6
MAX_HINTS = 3
MAX_HINT = 300


def template_problems(t: ScenarioTemplate) -> list[str]:
    """Every problem visible without running the template (empty: none)."""
    problems: list[str] = []
    if not t.slots:
        problems.append("template: no slots, so every seed would give the same task")
    if len(t.slots) > MAX_SLOTS:
        problems.append(f"template: {len(t.slots)} slots (at most {MAX_SLOTS})")
    for name, slot in t.slots.items():
        what = f"template slot {name!r}"
        if not _IDENT.match(name):
            problems.append(f"{what}: name must be snake_case ([a-z][a-z0-9_]*)")
        if slot.kind == "choice" and len(set(slot.options)) < 2:
            problems.append(f"{what}: a choice needs at least two different options")
        if slot.kind == "choice" and any(PLACEHOLDER.search(o) for o in slot.options):
            problems.append(f"{what}: options cannot hold placeholders")
        if slot.kind == "integer" and not slot.low < slot.high:
            problems.append(f"{what}: an integer needs low < high, got [{slot.low}, {slot.high}]")
    for index, hint in enumerate(t.hints):
        if PLACEHOLDER.search(hint):
            problems.append(
                f"template hint {index}: a hint cannot name a slot (it must not give the task's "
                "values away)"
            )
        if not hint.strip() or len(hint) > MAX_HINT:
            problems.append(f"template hint {index}: give 1 to {MAX_HINT} characters")
    if len(t.hints) > MAX_HINTS:
        problems.append(f"template: {len(t.hints)} hints (at most {MAX_HINTS})")
    if not t.requests:
        problems.append("template: no request phrasings")
    if not t.calls:
        problems.append("template: no calls; the reference must use a tool")
    elif not t.calls[-1].expect:
        problems.append(
            f"template: the last call ({t.calls[-1].tool}) expects no argument, so nothing "
            "could tell a right call from a wrong one"
        )
    if len(t.calls) > MAX_CALLS:
        problems.append(f"template: {len(t.calls)} calls (at most {MAX_CALLS})")
    texts = [("request", r) for r in t.requests] + [("reply", t.reply)]
    texts += [(f"value {name!r}", text) for name, text in t.values.items()]
    for index, call in enumerate(t.calls):
        where = f"call {index + 1} ({call.tool})"
        texts += [(f"{where} argument {k!r}", v) for k, v in call.arguments.items()]
        for key in call.expect:
            if key not in call.arguments:
                problems.append(f"template {where}: expects {key!r}, which it does not pass")
    for where, text in texts:
        if isinstance(text, str):
            problems += [f"template {where}: {p}" for p in _placeholder_problems(text, t.slots)]
    for name in t.values:
        if not _IDENT.match(name):
            problems.append(f"template value {name!r}: name must be snake_case")
    return problems


def _placeholder_problems(text: str, slots: dict[str, Slot]) -> list[str]:
    problems = []
    for ref in PLACEHOLDER.findall(text):
        match = _REF.match(ref)
        if not match:
            problems.append(f"placeholder {{{ref}}} is not {{slot}} or {{slot.field}}")
            continue
        name, field = match.groups()
        slot = slots.get(name)
        if slot is None:
            problems.append(f"placeholder {{{ref}}} names no slot")
        elif field and field not in SLOT_FIELDS[slot.kind]:
            allowed = ", ".join(SLOT_FIELDS[slot.kind]) or "none"
            problems.append(
                f"placeholder {{{ref}}}: a {slot.kind} has no field {field!r} ({allowed})"
            )
    if "{" in PLACEHOLDER.sub("", text) or "}" in PLACEHOLDER.sub("", text):
        problems.append(f"unbalanced braces in {text!r}")
    return problems


def _draw(s: Scenario, slot: Slot) -> Any:
    if slot.kind == "contact":
        return s.b.person(relation=slot.relation)
    if slot.kind == "choice":
        return s.rng.choice(slot.options)
    if slot.kind == "integer":
        return s.rng.randint(slot.low, slot.high)
    return f"{s.rng.randint(6, 21):02d}:{s.rng.choice(MINUTES):02d}"


def _field(value: Any, field: str | None) -> Any:
    if isinstance(value, dict):  # a contact row
        if field == "first":
            return value["name"].split()[0]
        return value[field or "name"]
    return value


def render(text: Any, drawn: dict[str, Any]) -> Any:
    """`text` with its placeholders filled; a lone placeholder keeps the value's type."""
    if not isinstance(text, str):
        return text
    whole = PLACEHOLDER.fullmatch(text)
    if whole:
        name, _, field = whole.group(1).partition(".")
        return _field(drawn[name], field or None)

    def one(match: re.Match[str]) -> str:
        name, _, field = match.group(1).partition(".")
        return str(_field(drawn[name], field or None))

    return PLACEHOLDER.sub(one, text)


def _matcher(kind: MatchKind, value: Any) -> m.Matcher:
    if kind == "number":
        return m.number(float(value))
    text = str(value)
    if kind == "phone":
        return m.phone(normalize_phone(text))
    if kind == "clock":
        return m.clock(text)
    if kind == "has":
        return m.has(w for w in re.findall(r"[A-Za-z0-9]+", text) if len(w) > 2)
    return m.eq(text)


def _generate(t: ScenarioTemplate, s: Scenario) -> None:
    b = s.b
    drawn = {name: _draw(s, slot) for name, slot in t.slots.items()}
    for name, slot in t.slots.items():
        if slot.kind != "contact":
            continue
        person = drawn[name]
        b.allowed_phones.append(person["phone"])
        last = person["name"].split()[-1]
        for _ in range(s.knobs.distractors):  # look-alikes: same last name, another person
            other = b.person()
            other_first = other["name"].split()[0]
            other["name"] = f"{other_first} {last}"
            other["email"] = f"{other_first}.{last}@example.com".lower()
    b.request = render(s.rng.choice(t.requests), drawn)
    for call in t.calls:
        args = {key: render(value, drawn) for key, value in call.arguments.items()}
        s.act(call.tool, **args)
        if call.expect:
            s.expect(call.tool, **{k: _matcher(kind, args[k]) for k, kind in call.expect.items()})
    b.say(render(t.reply, drawn))
    for name, text in t.values.items():
        s.value(name, m.phrases([render(text, drawn)]))


def template_family(t: ScenarioTemplate) -> Family:
    """The template as a `Family`: what it needs, expects and produces, and default checks."""
    needed = tuple(dict.fromkeys(call.tool for call in t.calls))
    expects: dict[str, set[str]] = {}
    for call in t.calls:
        if call.expect:
            expects.setdefault(call.tool, set()).update(call.expect)
    action = t.calls[-1].tool if t.calls else ""
    contacts = any(slot.kind == "contact" for slot in t.slots.values())
    extra: list[CheckSpec] = []
    if t.values:
        extra.append(CheckSpec(kind="reply_mentions", weight=0.2, value=next(iter(t.values))))
    if action in MUTATING:
        extra.append(CheckSpec(kind="no_forbidden_side_effect", weight=0.2))
    keys = sorted(expects.get(action, ()))
    main = CheckSpec(
        kind="called_tool", weight=round(1.0 - 0.2 * len(extra), 6), tool=action, keys=keys
    )
    checks = [main, *extra]

    def generate(s: Scenario) -> None:
        _generate(t, s)

    return Family(
        name=TEMPLATE,
        capability="",
        action=action,
        needed=needed,
        distractors=(),
        expects={tool: tuple(sorted(keys)) for tool, keys in expects.items()},
        values=tuple(t.values),
        reads=frozenset({"distractors"}) if contacts else frozenset(),
        tunes=(
            ("distractors", "distractor_tools", "transient_failure_rate")
            if contacts
            else ("distractor_tools", "transient_failure_rate")
        ),
        knobs=Knobs(),
        checks=tuple(checks),
        generate=generate,
    )
