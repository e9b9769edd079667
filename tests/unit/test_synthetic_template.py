"""Scenario templates: a family written as data runs like a hand-written one, or is refused."""

from __future__ import annotations

import json

import msgspec
import pytest

from shared.envs.protocol import Message, ToolCall, ToolCallFunction
from shared.envs.synthetic import (
    SyntheticEnvironment,
    check_deterministic,
    toolbox_schemas,
    validate,
)
from shared.envs.synthetic.defaults import template_spec
from shared.envs.synthetic.spec import Call, CheckSpec, ScenarioTemplate, Slot, decode, encode
from shared.envs.synthetic.template import TEMPLATE, render, template_problems

TARGET = toolbox_schemas()

TEXT_A_CONTACT = ScenarioTemplate(
    slots={
        "person": Slot(kind="contact", relation="sister"),
        "note": Slot(kind="choice", options=["running late", "bring snacks", "call me back"]),
    },
    requests=[
        "Text my sister {person.first}: {note}.",
        "Send {person.first} a message saying {note}.",
    ],
    calls=[
        Call(tool="search_contacts", arguments={"query": "{person.first}"}),
        Call(
            tool="send_message",
            arguments={"phone_number": "{person.phone}", "body": "{note}"},
            expect={"phone_number": "phone", "body": "has"},
        ),
    ],
    reply="I texted {person.name}: {note}.",
    values={"recipient": "{person.first}"},
)

TIMED_ALARM = ScenarioTemplate(
    slots={
        "time": Slot(kind="clock"),
        "label": Slot(kind="choice", options=["gym", "dentist", "pick up kids", "standup"]),
    },
    requests=["Set an alarm at {time} for {label}."],
    calls=[
        Call(
            tool="set_alarm",
            arguments={"time": "{time}", "label": "{label}"},
            expect={"time": "clock", "label": "eq"},
        )
    ],
    reply="Your {label} alarm is set for {time}.",
    values={"time": "{time}"},
)


def spec(template: ScenarioTemplate = TEXT_A_CONTACT, **kw: object):  # type: ignore[no-untyped-def]
    return template_spec("look_up_before_texting", "Search contacts first.", template, **kw)


def call(name: str, arguments: dict[str, object], call_id: str = "c1") -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


@pytest.mark.parametrize("template", [TEXT_A_CONTACT, TIMED_ALARM])
def test_a_template_spec_validates_replays_to_one_and_is_deterministic(
    template: ScenarioTemplate,
) -> None:
    s = spec(template)
    assert s.scenario == TEMPLATE
    assert validate(s, TARGET) == []
    assert check_deterministic(s, range(5)) == []
    assert abs(sum(c.weight for c in s.checks) - 1) < 1e-9
    assert decode(encode(s)) == s  # it travels as JSON


def test_seeds_give_different_worlds_and_requests_and_tasks_are_distinct() -> None:
    env = SyntheticEnvironment(spec())
    tasks = env.tasks()
    assert len(tasks) == 200
    assert len({t.data["request"] for t in tasks}) > 50
    phones = {t.data["expected"]["send_message"]["phone_number"]["value"] for t in tasks}
    assert len(phones) > 150
    assert {t.split for t in tasks} == {"train", "test"}


def test_rewards_are_graded() -> None:
    env = SyntheticEnvironment(spec())
    task = env.tasks()[0]
    data = task.data
    phone = data["expected"]["send_message"]["phone_number"]["value"]
    body = " ".join(data["expected"]["send_message"]["body"]["value"])
    first = data["values"]["recipient"]["value"][0]

    def play(*messages: Message) -> float:
        episode = env.reset(task, 0)
        for message in messages:
            episode.step(message)
        return episode.score().reward

    nothing = Message(role="assistant", content="I cannot do that.")
    right = call("send_message", {"phone_number": phone, "body": body})
    wrong = call("send_message", {"phone_number": "+15550000000", "body": body})
    told = Message(role="assistant", content=f"Done, I texted {first}.")
    assert play(nothing) == 0.0
    assert play(wrong, told) < play(right) < play(right, told) == 1.0


def test_argument_types_survive_a_lone_placeholder() -> None:
    drawn = {"n": 42, "who": {"name": "Ada Byron", "phone": "+15550001"}}
    assert render("{n}", drawn) == 42
    assert render("{n} minutes", drawn) == "42 minutes"
    assert render("{who}", drawn) == "Ada Byron"
    assert render("{who.first} at {who.phone}", drawn) == "Ada at +15550001"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"slots": {}}, "no slots"),
        ({"slots": {"x": Slot(kind="choice", options=["a"])}}, "at least two different options"),
        ({"slots": {"Bad Name": Slot(kind="integer", low=1, high=5)}}, "snake_case"),
        ({"slots": {"n": Slot(kind="integer", low=5, high=5)}}, "low < high"),
        ({"requests": []}, "no request phrasings"),
        ({"requests": ["Text {nobody}"]}, "names no slot"),
        ({"requests": ["Text {person.age}"]}, "has no field 'age'"),
        ({"requests": ["Text {person"]}, "unbalanced braces"),
        ({"calls": []}, "no calls"),
        (
            {"calls": [Call(tool="send_message", arguments={"body": "x"}, expect={"to": "eq"})]},
            "expects 'to', which it does not pass",
        ),
        (
            {"calls": [Call(tool="search_contacts", arguments={"query": "{person.first}"})]},
            "expects no argument",
        ),
        ({"hints": ["Text {person.first} after looking them up"]}, "cannot name a slot"),
        ({"hints": ["x" * 301]}, "give 1 to 300 characters"),
        ({"hints": ["a", "b", "c", "d"]}, "4 hints (at most 3)"),
    ],
)
def test_template_problems_are_named(change: dict[str, object], problem: str) -> None:
    broken = msgspec.structs.replace(TEXT_A_CONTACT, **change)
    problems = template_problems(broken)
    assert any(problem in p for p in problems), problems
    assert any(problem in p for p in validate(spec(broken), TARGET))


def test_a_template_needs_its_scenario_and_the_scenario_needs_a_template() -> None:
    s = spec()
    assert "needs a `template`" in " ".join(
        validate(msgspec.structs.replace(s, template=None), TARGET)
    )
    wrong = msgspec.structs.replace(s, scenario="set_alarm_at_time")
    assert "only read when scenario is 'template'" in " ".join(validate(wrong, TARGET))


def test_unknown_tools_and_checks_on_values_it_does_not_produce_are_refused() -> None:
    ghost = msgspec.structs.replace(
        TEXT_A_CONTACT,
        calls=[Call(tool="fax_document", arguments={"to": "{person.phone}"}, expect={"to": "eq"})],
    )
    assert any("unknown tool 'fax_document'" in p for p in validate(spec(ghost), TARGET))
    bad_check = spec(checks=[CheckSpec(kind="reply_mentions", weight=1.0, value="price")])
    assert any("produces no value 'price'" in p for p in validate(bad_check, TARGET))


def test_arguments_a_tool_rejects_show_up_in_the_reference_replay() -> None:
    bad_time = msgspec.structs.replace(
        TIMED_ALARM,
        slots={**TIMED_ALARM.slots, "time": Slot(kind="choice", options=["7pm", "8pm"])},
    )
    problems = check_deterministic(spec(bad_time), range(2))
    assert problems and all("not 1.0" in p for p in problems), problems


def test_the_writer_s_hints_join_each_task_s_hint_without_its_values() -> None:
    hinted = msgspec.structs.replace(
        TEXT_A_CONTACT, hints=["You only know a first name: look the number up first."]
    )
    env = SyntheticEnvironment(spec(hinted))
    for task in env.tasks()[:10]:
        hint = env.reset(task, 1).hint
        assert "look the number up first" in hint and "<tool_call>" in hint
        assert task.data["request"] not in hint
