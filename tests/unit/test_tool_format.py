"""The tool-call parser: good calls round-trip, malformed ones are reported, never guessed."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from shared.llm.tool_format import parse_reply

names = st.from_regex(r"\A[a-z_][a-z0-9_]{0,20}\Z")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=4)


def block(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@given(st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_well_formed_calls_round_trip(calls: list[tuple[str, dict]]) -> None:
    parsed = parse_reply("\n".join(block(n, a) for n, a in calls))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert parsed.malformed == [] and parsed.content is None


@given(st.text(max_size=300))
def test_any_text_parses_without_raising(text: str) -> None:
    parsed = parse_reply(text)
    if "<tool_call>" not in text:
        assert parsed.calls == [] and parsed.malformed == []
        assert parsed.content == (text.strip() or None)


def test_text_around_a_call_is_kept() -> None:
    parsed = parse_reply("Let me check.\n" + block("get_time", {}))
    assert parsed.content == "Let me check."
    assert [c.name for c in parsed.calls] == ["get_time"]


def test_arguments_given_as_a_json_string_are_accepted() -> None:
    parsed = parse_reply('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert json.loads(parsed.calls[0].arguments) == {"a": 1}


def test_malformed_calls_are_reported_with_reasons() -> None:
    cases = {
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>': "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "missing a string 'name'",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "f", "arguments": "nope"}</tool_call>': "string that is not JSON",
        '<tool_call>{"name": "f", "arguments": {}}': "unterminated",
    }
    for text, reason in cases.items():
        parsed = parse_reply(text)
        assert parsed.calls == [], text
        assert len(parsed.malformed) == 1 and reason in parsed.malformed[0].error, (text, parsed)
        assert parsed.content == text.strip()  # the raw text stays visible


def test_a_broken_call_beside_good_ones_stays_visible() -> None:
    text = block("a", {}) + '\n<tool_call>{"name": "b", oops}</tool_call>'
    parsed = parse_reply(text)
    assert [c.name for c in parsed.calls] == ["a"]
    assert parsed.malformed[0].name == "b"
    assert parsed.content is not None and "oops" in parsed.content
