"""Validate a spec against its target: every problem, in words, or an empty list.

A spec is refused when it names an unknown version, target, scenario family or check kind;
carries a scenario template with problems (template.py lists them);
offers a tool the target lacks, or with a schema that differs from the target's; leaves out a
tool its family needs; sets a knob out of range or one its family ignores; or has checks whose
weights do not sum to 1, that miss the fields their kind needs, or that refer to a tool not
offered or to an expected argument or reply value the family does not produce.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from shared.envs.synthetic.checks import CHECK_FIELDS, CHECK_KINDS
from shared.envs.synthetic.families import FAMILIES, family_of
from shared.envs.synthetic.scenario import Family
from shared.envs.synthetic.spec import (
    GENERIC_KNOBS,
    KNOB_BOUNDS,
    SPEC_VERSION,
    CheckSpec,
    Knobs,
    SyntheticSpec,
)
from shared.envs.synthetic.target import TARGETS
from shared.envs.synthetic.template import TEMPLATE, template_problems

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,79}$")
WEIGHT_TOLERANCE = 1e-6
MAX_TASKS = 10_000


def validate(spec: SyntheticSpec, target_tool_schemas: Iterable[dict[str, Any]]) -> list[str]:
    """Every problem with `spec` against the target's OpenAI tool schemas (empty: valid)."""
    problems: list[str] = []
    if spec.spec_version != SPEC_VERSION:
        problems.append(f"spec_version {spec.spec_version} is not supported (only {SPEC_VERSION})")
    if spec.target not in TARGETS:
        problems.append(f"unknown target {spec.target!r}; known: {', '.join(TARGETS)}")
    if not NAME.match(spec.name):
        problems.append(f"name {spec.name!r} must be a lowercase slug ([a-z0-9_.-], <= 80)")
    if not 1 <= spec.task_count <= MAX_TASKS:
        problems.append(f"task_count {spec.task_count} must be between 1 and {MAX_TASKS}")
    if not spec.capability.name.strip():
        problems.append("capability name is empty")
    if spec.scenario == TEMPLATE:
        if spec.template is None:
            problems.append(f"scenario {TEMPLATE!r} needs a `template`")
        else:
            template = template_problems(spec.template)
            problems += template
            if template:  # a broken template's declaration would only add noise
                return problems
    elif spec.template is not None:
        problems.append(f"a `template` is only read when scenario is {TEMPLATE!r}")
    family = family_of(spec)
    if family is None and spec.scenario != TEMPLATE:
        known = ", ".join([*FAMILIES, TEMPLATE])
        problems.append(f"unknown scenario {spec.scenario!r}; known: {known}")
    problems += _tool_problems(spec, target_tool_schemas, family)
    problems += _knob_problems(spec, family)
    problems += _check_problems(spec, family)
    return problems


def _tool_problems(
    spec: SyntheticSpec, target_tool_schemas: Iterable[dict[str, Any]], family: Family | None
) -> list[str]:
    target = {schema["function"]["name"]: schema for schema in target_tool_schemas}
    problems = [
        f"tool {name!r} is listed twice" for name, n in Counter(spec.offered()).items() if n > 1
    ]
    for ref in spec.tools:
        if ref.role not in ("needed", "distractor"):
            problems.append(f"tool {ref.name!r}: unknown role {ref.role!r}")
        if ref.name not in target:
            problems.append(f"unknown tool {ref.name!r}: the {spec.target} target has no such tool")
            continue
        where = _difference(target[ref.name], ref.schema, "schema")
        if where:
            problems.append(f"tool {ref.name!r}: schema differs from the target's at {where}")
    needed = set(spec.offered("needed"))
    for name in family.needed if family else ():
        if name not in needed:
            problems.append(f"scenario {spec.scenario} needs tool {name!r}: offer it as 'needed'")
    return problems


def _difference(want: Any, got: Any, path: str) -> str | None:
    """The first path where `got` departs from `want`, or None when they are equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got), key=str):
            if key not in want or key not in got:
                return f"{path}.{key}"
            where = _difference(want[key], got[key], f"{path}.{key}")
            if where:
                return where
        return None
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            where = _difference(a, b, f"{path}[{index}]")
            if where:
                return where
        return None
    same = want == got and type(want) is type(got)
    return None if same else path


def _knob_problems(spec: SyntheticSpec, family: Family | None) -> list[str]:
    problems = []
    defaults = Knobs()
    for knob, (low, high, _) in KNOB_BOUNDS.items():
        value = getattr(spec.knobs, knob)
        if isinstance(getattr(defaults, knob), int) and not isinstance(value, int):
            problems.append(f"knob {knob} must be an integer, not {value!r}")
        elif not low <= value <= high:
            problems.append(f"knob {knob}={value} is out of range [{low}, {high}]")
        read = family is None or knob in GENERIC_KNOBS or knob in family.reads
        if not read and value != getattr(defaults, knob):
            problems.append(f"knob {knob}={value} has no effect on scenario {spec.scenario}")
    pool = len(spec.offered("distractor"))
    if spec.knobs.distractor_tools > pool:
        problems.append(
            f"knob distractor_tools={spec.knobs.distractor_tools} exceeds the {pool} "
            "distractor tools the spec lists"
        )
    return problems


def _check_problems(spec: SyntheticSpec, family: Family | None) -> list[str]:
    if not spec.checks:
        return ["no checks: the reward would be constant"]
    problems = []
    total = sum(check.weight for check in spec.checks)
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        problems.append(f"check weights sum to {total:.6g}, not 1")
    labels = Counter(check.label for check in spec.checks)
    problems += [f"check label {label!r} is used twice" for label, n in labels.items() if n > 1]
    for check in spec.checks:
        problems += _one_check(spec, family, check)
    return problems


def _one_check(spec: SyntheticSpec, family: Family | None, check: CheckSpec) -> list[str]:
    what = f"check {check.label!r}"
    if check.kind not in CHECK_KINDS:
        return [f"{what}: unknown kind {check.kind!r}; known: {', '.join(CHECK_KINDS)}"]
    problems = []
    if not 0 < check.weight <= 1:
        problems.append(f"{what}: weight {check.weight} must be in (0, 1]")
    for field in CHECK_FIELDS.get(check.kind, ()):
        if not getattr(check, field):
            problems.append(f"{what}: kind {check.kind} needs `{field}`")
    offered = set(spec.offered())
    for tool in (check.tool, check.before):
        if tool and tool not in offered:
            problems.append(f"{what}: refers to tool {tool!r}, which the spec does not offer")
    if family is None:
        return problems
    if check.kind == "called_tool" and check.tool:
        produced = family.expects.get(check.tool)
        if produced is None:
            problems.append(f"{what}: {family.name} writes no expected call of {check.tool!r}")
        elif not set(check.keys) <= set(produced):
            extra = sorted(set(check.keys) - set(produced))
            problems.append(f"{what}: {family.name} writes no expected value for {extra}")
    if check.kind == "reply_mentions" and check.value and check.value not in family.values:
        problems.append(f"{what}: {family.name} produces no value {check.value!r}")
    return problems
