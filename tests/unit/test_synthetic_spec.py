"""synthetic specs: defaults per capability, validation of every kind of problem, determinism."""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import subprocess
import sys

import msgspec
import pytest

from shared.envs.synthetic import (
    CheckSpec,
    InvalidSpecError,
    SyntheticEnvironment,
    SyntheticSpec,
    ToolRef,
    check_deterministic,
    default_spec,
    family_for,
    family_spec,
    toolbox_schemas,
    validate,
)
from shared.envs.synthetic.checks import CHECK_KINDS
from shared.envs.synthetic.defaults import CAPABILITY_FAMILIES, FALLBACK
from shared.envs.synthetic.families import FAMILIES
from shared.envs.synthetic.scenario import Scenario
from shared.envs.synthetic.spec import GENERIC_KNOBS, KNOB_BOUNDS, Knobs, decode, encode

TARGET = toolbox_schemas()
CAPABILITIES = {
    "valid_tool_arguments": "Calls tools with arguments that match their schemas and formats.",
    "recover_from_tool_errors": "Reads a tool error and retries or fixes the call.",
    "ask_for_missing_information": "Asks the user for a required detail instead of guessing.",
    "report_result_to_user": "Tells the user the result of what it did or looked up.",
    "look_up_before_acting": "Looks up ids and numbers before acting on them.",
}


def spec_for(family: str) -> SyntheticSpec:
    return family_spec(family, f"trains_{family}", "")


replace = msgspec.structs.replace


# -- defaults ----------------------------------------------------------------------------


def test_every_family_has_a_default_spec_that_validates_and_is_deterministic() -> None:
    for family in FAMILIES:
        spec = spec_for(family)
        assert validate(spec, TARGET) == [], family
        assert check_deterministic(spec, range(4)) == [], family
        assert abs(sum(c.weight for c in spec.checks) - 1) < 1e-9


def test_the_named_capabilities_map_to_their_families_and_others_by_keyword() -> None:
    for capability, family in CAPABILITY_FAMILIES.items():
        assert family_for(capability, CAPABILITIES.get(capability, "")) == family
        spec = default_spec(capability, CAPABILITIES.get(capability, ""))
        assert spec.scenario == family and spec.capability.name == capability
        assert spec.name == capability and validate(spec, TARGET) == []
        assert check_deterministic(spec, [11]) == []
    assert set(CAPABILITIES) <= set(CAPABILITY_FAMILIES)
    stop = default_spec("stop_after_completion")
    assert "stopped_after_done" in {c.kind for c in stop.checks}
    assert family_for("retry_after_failure") == "recover_from_rejected_call"
    assert family_for("clarify_ambiguous_requests") == "reminder_with_missing_detail"
    assert family_for("format_phone_numbers") == "send_message_to_contact"
    assert family_for("cap_17", "Searches for the record and verifies it") == FALLBACK
    assert family_for("cap_17", "gives the user the answer it found") == "convert_and_report"
    assert family_for("zzz", "") == FALLBACK
    # "task" must not read as "ask"
    assert family_for("finish_the_task") == FALLBACK
    odd = default_spec("Handle Weird Stuff!", "")
    assert odd.name == "handle_weird_stuff" and validate(odd, TARGET) == []


def test_families_declare_only_real_knobs_tools_and_check_kinds() -> None:
    assert set(KNOB_BOUNDS) == set(Knobs.__struct_fields__)
    assert GENERIC_KNOBS.issubset(KNOB_BOUNDS)
    target = {schema["function"]["name"] for schema in TARGET}
    for family in FAMILIES.values():
        assert family.reads <= set(KNOB_BOUNDS) and set(family.tunes) <= set(KNOB_BOUNDS)
        assert family.action in family.needed
        assert set(family.needed) | set(family.distractors) <= target
        assert not set(family.needed) & set(family.distractors)
        assert {check.kind for check in family.checks} <= set(CHECK_KINDS)


def test_a_spec_round_trips_through_json_and_a_malformed_one_is_refused() -> None:
    spec = spec_for("convert_and_report")
    assert decode(encode(spec)) == spec
    assert decode(encode(spec)).spec_version == 1
    with pytest.raises(InvalidSpecError):
        decode(b'{"name": "x", "capability": {"name": "c"}, "scenario": 3}')
    with pytest.raises(InvalidSpecError):
        decode(b"{not json")


# -- validation ----------------------------------------------------------------------------


def test_validation_rejects_an_unknown_tool() -> None:
    spec = spec_for("set_alarm_at_time")
    bad = replace(spec, tools=[*spec.tools, ToolRef(name="teleport", role="distractor")])
    problems = validate(bad, TARGET)
    assert any("unknown tool 'teleport'" in p for p in problems), problems
    with pytest.raises(InvalidSpecError, match="teleport"):
        SyntheticEnvironment(bad)


def test_validation_rejects_a_schema_that_differs_from_the_targets() -> None:
    spec = spec_for("set_alarm_at_time")
    schema = copy.deepcopy(spec.tools[0].schema)
    schema["function"]["parameters"]["properties"]["time"]["description"] = "Any time you like."
    tampered = replace(spec, tools=[replace(spec.tools[0], schema=schema), *spec.tools[1:]])
    problems = validate(tampered, TARGET)
    assert problems == [
        "tool 'set_alarm': schema differs from the target's at "
        "schema.function.parameters.properties.time.description"
    ]
    loose = copy.deepcopy(spec.tools[0].schema)
    loose["function"]["parameters"]["additionalProperties"] = True
    problems = validate(replace(spec, tools=[replace(spec.tools[0], schema=loose)]), TARGET)
    assert any("additionalProperties" in p for p in problems), problems


def test_validation_rejects_weights_that_do_not_sum_to_one() -> None:
    spec = spec_for("convert_and_report")
    heavier = [replace(spec.checks[0], weight=0.7), *spec.checks[1:]]
    problems = validate(replace(spec, checks=heavier), TARGET)
    assert problems == ["check weights sum to 1.2, not 1"]


def test_validation_lists_every_other_problem() -> None:
    spec = spec_for("look_up_contact_then_message")
    bad = replace(
        spec,
        spec_version=2,
        scenario="teleport_somewhere",
        knobs=replace(spec.knobs, distractors=99, withhold_rate=-0.5),
        checks=[
            CheckSpec(kind="vibes", weight=0.5),
            CheckSpec(kind="called_tool", weight=0.25, tool="delete_event", keys=["event_id"]),
            CheckSpec(kind="reply_mentions", weight=0.25),
        ],
    )
    text = "\n".join(validate(bad, TARGET))
    assert "spec_version 2 is not supported" in text
    assert "unknown scenario 'teleport_somewhere'" in text
    assert "knob distractors=99 is out of range" in text
    assert "knob withhold_rate=-0.5 is out of range" in text
    assert "unknown kind 'vibes'" in text
    assert "refers to tool 'delete_event', which the spec does not offer" in text
    assert "kind reply_mentions needs `value`" in text


def test_validation_checks_the_spec_against_its_family() -> None:
    spec = spec_for("look_up_contact_then_message")
    no_lookup = [t for t in spec.tools if t.name != "search_contacts"]
    problems = validate(replace(spec, tools=no_lookup), TARGET)
    assert any("needs tool 'search_contacts'" in p for p in problems)
    assert any("'looked_up_first" in p and "does not offer" in p for p in problems)
    checks = [
        CheckSpec(kind="called_tool", weight=0.5, tool="send_message", keys=["priority"]),
        CheckSpec(kind="reply_mentions", weight=0.5, value="weather"),
    ]
    knobs = replace(spec.knobs, withhold_rate=0.5, distractor_tools=9)
    problems = validate(replace(spec, checks=checks, knobs=knobs), TARGET)
    text = "\n".join(problems)
    assert "writes no expected value for ['priority']" in text
    assert "produces no value 'weather'" in text
    assert "withhold_rate=0.5 has no effect on scenario look_up_contact_then_message" in text
    assert "distractor_tools=9 exceeds the 4 distractor tools" in text
    twice = [*spec.checks[:-1], replace(spec.checks[-1], name="no_forbidden_side_effect")]
    assert any("used twice" in p for p in validate(replace(spec, checks=twice), TARGET))


# -- determinism ---------------------------------------------------------------------------


def test_a_generator_drawing_from_the_global_random_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    family = FAMILIES["set_alarm_at_time"]

    def leaky(s: Scenario) -> None:
        family.generate(s)
        s.b.request += f" Thanks, {random.choice(['Ana', 'Bo', 'Cy', 'Di', 'Ed', 'Flo'])}!"
        s.b.fixture["now"] = f"2025-0{random.randint(1, 9)}-01T09:00"

    monkeypatch.setitem(FAMILIES, family.name, dataclasses.replace(family, generate=leaky))
    state = random.getstate()
    random.seed(7)  # a fixed global stream, so the test itself is repeatable
    try:
        problems = check_deterministic(spec_for("set_alarm_at_time"), [1, 2, 3])
    finally:
        random.setstate(state)
    assert len(problems) >= 2, problems
    assert all("not deterministic for this seed" in p for p in problems)
    assert any("opening messages" in p and "world" in p for p in problems)


def test_a_generator_whose_reference_fails_or_that_crashes_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    family = FAMILIES["convert_and_report"]

    def lazy(s: Scenario) -> None:
        family.generate(s)
        s.b.reference.pop()  # no final reply: the result is never reported

    def broken(s: Scenario) -> None:
        raise ZeroDivisionError("oops")

    spec = spec_for("convert_and_report")
    monkeypatch.setitem(FAMILIES, family.name, dataclasses.replace(family, generate=lazy))
    assert check_deterministic(spec, [5]) == ["seed 5: the reference solution scores 0.5, not 1.0"]
    monkeypatch.setitem(FAMILIES, family.name, dataclasses.replace(family, generate=broken))
    assert check_deterministic(spec, [5]) == [
        "seed 5: building the episode failed: ZeroDivisionError('oops')"
    ]


def test_tasks_do_not_depend_on_the_hash_seed() -> None:
    script = (
        "import hashlib, json, msgspec\n"
        "from shared.envs.synthetic import SyntheticEnvironment, default_spec\n"
        "from shared.envs.synthetic.defaults import CAPABILITY_FAMILIES\n"
        "h = hashlib.sha256()\n"
        "for cap in CAPABILITY_FAMILIES:\n"
        "    for t in SyntheticEnvironment(default_spec(cap)).tasks()[:30]:\n"
        "        h.update(msgspec.json.encode(t))\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1
