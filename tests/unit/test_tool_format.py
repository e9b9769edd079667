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


# Forms small models write instead of the tagged one (Qwen2.5-Coder-0.5B writes these two).
DECLARED = ("set_alarm", "send_message", "get_current_time")
declared_names = st.sampled_from(DECLARED)
# Free text around a call: no braces, brackets, backticks or tags, so it holds no JSON.
prose = st.text(
    alphabet=st.characters(blacklist_characters="{}[]`<>", blacklist_categories=("Cs",)),
    max_size=40,
)


def as_json(name: str, args: dict) -> str:
    return json.dumps({"name": name, "arguments": args})


@given(prose, st.lists(st.tuples(declared_names, arguments), min_size=1, max_size=3), prose)
def test_bare_calls_naming_declared_tools_are_read(
    before: str, calls: list[tuple[str, dict]], after: str
) -> None:
    text = before + " " + "\n".join(as_json(n, a) for n, a in calls) + " " + after
    parsed = parse_reply(text, DECLARED)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert parsed.form == "bare" and parsed.malformed == []
    assert (parsed.content or "").split() == (before + " " + after).split()


@given(
    prose,
    st.lists(st.tuples(declared_names, arguments), min_size=1, max_size=3),
    st.sampled_from(["json", "", "JSON", "tool_call"]),
    st.booleans(),
)
def test_fenced_calls_are_read_one_per_fence_or_as_a_list(
    before: str, calls: list[tuple[str, dict]], language: str, as_list: bool
) -> None:
    if as_list:
        body = json.dumps([{"name": n, "arguments": a} for n, a in calls], indent=2)
        text = f"{before}\n```{language}\n{body}\n```"
    else:
        text = before + "".join(f"\n```{language}\n{as_json(n, a)}\n```" for n, a in calls)
    parsed = parse_reply(text, DECLARED)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert parsed.form == "fenced" and parsed.malformed == []
    assert (parsed.content or "").split() == before.split()


@given(st.tuples(names, arguments), st.booleans())
def test_json_naming_no_declared_tool_is_text(call: tuple[str, dict], fenced: bool) -> None:
    name, args = call
    body = as_json(name if name not in DECLARED else name + "_x", args)
    text = f"```json\n{body}\n```" if fenced else f"Here it is: {body}"
    parsed = parse_reply(text, DECLARED)
    assert parsed.calls == [] and parsed.malformed == [] and parsed.form is None
    assert parsed.content == text.strip()


@given(st.text(max_size=300), st.lists(declared_names, max_size=3))
def test_any_text_parses_without_raising_whatever_the_tools(text: str, tools: list[str]) -> None:
    parsed = parse_reply(text, tools)
    assert (parsed.form is None) == (not parsed.calls and not parsed.malformed)
    if not any(c in text for c in "{[<"):
        assert parsed.calls == [] and parsed.content == (text.strip() or None)


@given(st.tuples(names, arguments))
def test_without_declared_tools_only_the_tagged_form_is_read(call: tuple[str, dict]) -> None:
    name, args = call
    assert parse_reply(as_json(name, args)).calls == []
    assert parse_reply(f"```json\n{as_json(name, args)}\n```").calls == []
    tagged = parse_reply(block(name, args))
    assert tagged.form == "tagged" and [c.name for c in tagged.calls] == [name]


def test_the_forms_qwen_coder_writes() -> None:
    """Replies seen from Qwen2.5-Coder-0.5B-Instruct on toolbox tasks."""
    fenced = parse_reply(
        '```json\n{\n  "name": "set_alarm",\n  "arguments": {\n    "time": "07:00",\n'
        '    "label": "gym"\n  }\n}\n```',
        DECLARED,
    )
    assert fenced.form == "fenced" and fenced.content is None
    assert json.loads(fenced.calls[0].arguments) == {"time": "07:00", "label": "gym"}
    bare = parse_reply('{"name": "get_current_time", "arguments": {}}', DECLARED)
    assert bare.form == "bare" and [c.name for c in bare.calls] == ["get_current_time"]


def test_openai_shaped_objects_and_parameters_are_read() -> None:
    wrapped = '{"type": "function", "function": {"name": "set_alarm", "arguments": {"a": 1}}}'
    assert [c.name for c in parse_reply(wrapped, DECLARED).calls] == ["set_alarm"]
    params = '{"name": "set_alarm", "parameters": {"a": 1}}'
    assert json.loads(parse_reply(params, DECLARED).calls[0].arguments) == {"a": 1}


def test_a_declared_call_with_bad_arguments_is_malformed_not_text() -> None:
    parsed = parse_reply('{"name": "set_alarm", "arguments": [1, 2]}', DECLARED)
    assert parsed.calls == [] and parsed.form == "bare"
    assert "must be a JSON object" in parsed.malformed[0].error
    broken = parse_reply('```json\n{"name": "set_alarm", "arguments": {"a": }\n```', DECLARED)
    assert broken.form == "fenced" and "not valid JSON" in broken.malformed[0].error
    assert broken.malformed[0].name == "set_alarm"


def test_the_tagged_form_is_reported() -> None:
    assert parse_reply(block("a", {})).form == "tagged"
    assert parse_reply("just text", DECLARED).form is None
