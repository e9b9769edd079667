"""The spec writer against a fake endpoint: a valid template becomes a checked spec; a bad one
is fed back with its problems; no usable reply in time is an error saying why."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from services.synthesize.writer import SpecWriter, SpecWriterError, WriterConfig
from shared.envs.synthetic.template import TEMPLATE
from tests.support.fake_chat import FakeJudge, Serve, script, user_text
from tests.unit.test_synthetic_template import TEXT_A_CONTACT

GOOD = {
    "template": msgspec.to_builtins(TEXT_A_CONTACT),
    "checks": [
        {
            "kind": "looked_up_first",
            "weight": 0.3,
            "tool": "search_contacts",
            "before": "send_message",
        },
        {"kind": "called_tool", "weight": 0.5, "tool": "send_message", "keys": ["phone_number"]},
        {"kind": "reply_mentions", "weight": 0.2, "value": "recipient"},
    ],
}
CONFIG = WriterConfig(model="writer", max_attempts=2, determinism_seeds=2)


TWO_TASKS = {
    "template": {
        "slots": {"label": {"kind": "choice", "options": ["gym", "nap"]}},
        "requests": ["Set a 07:00 alarm called {label}."],
        "calls": [
            {
                "tool": "set_alarm",
                "arguments": {"time": "07:00", "label": "{label}"},
                "expect": {"label": "eq"},
            }
        ],
        "reply": "Your {label} alarm is set.",
    }
}


def with_request(text: str) -> dict[str, Any]:
    return {**GOOD, "template": {**GOOD["template"], "requests": [text]}}


async def test_a_valid_reply_becomes_a_template_spec(serve: Serve) -> None:
    fake = FakeJudge(script("```json\n" + json.dumps(GOOD) + "\n```"))
    writer = SpecWriter(await serve(fake), CONFIG)
    spec = await writer.write("look_up_before_acting", "Search first.", ["user asked: text Ann"])
    assert spec.scenario == TEMPLATE and spec.template == TEXT_A_CONTACT
    assert [c.kind for c in spec.checks] == ["looked_up_first", "called_tool", "reply_mentions"]
    assert spec.name == "look_up_before_acting"
    [request] = fake.requests
    prompt = user_text(request)
    assert "Capability: look_up_before_acting" in prompt and "user asked: text Ann" in prompt
    assert "send_message(phone_number: string, body: string)" in prompt
    assert request["response_format"] == {"type": "json_object"}


async def test_missing_checks_take_the_template_defaults(serve: Serve) -> None:
    reply = json.dumps({"template": GOOD["template"]})
    spec = await SpecWriter(await serve(FakeJudge(script(reply))), CONFIG).write("x_skill", "")
    assert {c.kind for c in spec.checks} == {
        "called_tool",
        "reply_mentions",
        "no_forbidden_side_effect",
    }


async def test_problems_are_fed_back_and_a_corrected_reply_is_accepted(serve: Serve) -> None:
    bad = json.dumps(with_request("Text {nobody}: {note}."))
    fake = FakeJudge(script(bad, json.dumps(GOOD)))
    spec = await SpecWriter(await serve(fake), CONFIG).write("look_up_before_acting", "")
    assert spec.template == TEXT_A_CONTACT
    feedback = fake.requests[1]["messages"][-1]["content"]
    assert "placeholder {nobody} names no slot" in feedback


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("Sure, here is an environment!", "not valid JSON"),
        (json.dumps({"checks": []}), "wrong JSON shape"),
        (json.dumps(TWO_TASKS), "ran out of distinct scenarios"),
        (
            json.dumps({**GOOD, "checks": [{"kind": "called_tool", "weight": 0.5}]}),
            "weights sum to 0.5",
        ),
    ],
)
async def test_no_usable_reply_is_an_error_naming_the_problem(
    serve: Serve, reply: str, problem: str
) -> None:
    writer = SpecWriter(await serve(FakeJudge(script(reply))), CONFIG)
    with pytest.raises(SpecWriterError, match="no valid environment spec") as info:
        await writer.write("look_up_before_acting", "")
    assert problem in str(info.value)
