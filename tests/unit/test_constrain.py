"""The grammars of constrained replies (`shared.serving.constrain`): the JSON recogniser
agrees with `json.loads` on what is a whole JSON object, accepts every prefix of one however
it is cut into tokens, and the tool-call grammars allow exactly the offered names."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.serving.constrain import JSON_OBJECT, MAX_DEPTH, Grammar, State, for_request, tool_call

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
objects = st.dictionaries(st.text(max_size=6), values, max_size=5)


def dumped(obj: dict[str, Any], style: int, ascii_only: bool) -> str:
    if style == 0:
        return json.dumps(obj, ensure_ascii=ascii_only)
    if style == 1:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=ascii_only)
    return json.dumps(obj, indent=style, ensure_ascii=ascii_only)


def run(grammar: Grammar, pieces: list[str]) -> State | None:
    state: State | None = grammar.start()
    for piece in pieces:
        assert state is not None
        state = state.fed(piece)
        if state is None:
            return None
    return state


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points) if b > a]


@given(objects, st.integers(0, 3), st.booleans(), st.lists(st.integers(0, 10_000), max_size=8))
@settings(max_examples=200, deadline=None)
def test_every_json_object_is_accepted_whole_however_it_is_cut(
    obj: dict[str, Any], style: int, ascii_only: bool, cuts: list[int]
) -> None:
    text = dumped(obj, style, ascii_only)
    state = run(JSON_OBJECT, cut(text, cuts))
    assert state is not None, text
    assert state.complete
    # proper prefixes (every one of a short text, a spread of a long one): allowed, not whole
    for end in range(1, len(text), 1 + len(text) // 60):
        prefix = run(JSON_OBJECT, [text[:end]])
        assert prefix is not None and not prefix.complete, text[:end]
    assert run(JSON_OBJECT, [text, " "]) is None  # nothing after the object


JSONISH = st.text(alphabet='{}[]":,. 0123456789-+eEtrufalsn\\/ub\n\tx', max_size=40)


@given(JSONISH)
@settings(max_examples=2000, deadline=None)
def test_whole_means_exactly_what_json_loads_reads_as_an_object(text: str) -> None:
    state = run(JSON_OBJECT, [text]) if text else None
    try:
        parsed = json.loads(text)
        whole = isinstance(parsed, dict) and text == text.rstrip()
    except ValueError:
        whole = False
    assert (state is not None and state.complete) == whole, text


@given(JSONISH)
@settings(max_examples=1000, deadline=None)
def test_a_refused_text_has_no_valid_continuation_among_its_own_extensions(text: str) -> None:
    """Refusal is final: once a prefix is refused, adding text never makes it acceptable."""
    for end in range(1, len(text) + 1):
        if run(JSON_OBJECT, [text[:end]]) is None:
            assert run(JSON_OBJECT, [text]) is None
            break


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 01}', '{"a": 1.}', '{"a": .5}', '{"a": -}', '{"a": 1e}', '{"a": tru}', "[1]",
        '{"a" 1}', '{"a": 1,}', '{a: 1}', '{"a": "\\x"}', '{"a": "\\u12g4"}', '{"a": [1,]}',
        '{"a": 1]', '{"a": "tab\there"}', "{}}",
    ],
)  # fmt: skip
def test_malformed_objects_are_refused_where_they_go_wrong(text: str) -> None:
    state = run(JSON_OBJECT, [text])
    assert state is None or not state.complete


def test_nesting_is_bounded() -> None:
    deep = '{"a": ' + "[" * (MAX_DEPTH - 1)
    assert run(JSON_OBJECT, [deep]) is not None
    assert run(JSON_OBJECT, [deep + "["]) is None


NAMES = ("add", "add_alarm", "get_weather")


def test_a_required_call_names_one_of_the_tools_and_closes() -> None:
    grammar = tool_call(NAMES, named=False)
    good = '{"name": "add_alarm", "arguments": {"time": "07:00", "days": [1, 2]}}\n</tool_call>'
    state = run(grammar, cut(good, [3, 11, 15, 40, 70]))
    assert state is not None and state.complete
    short = run(grammar, ['{"name": "add", "arguments": {}}</tool_call>'])
    assert short is not None and short.complete  # a name that is a prefix of another
    assert run(grammar, ['{"name": "delete_everything"']) is None
    assert run(grammar, ['{"name": "add_al']) is not None  # on its way to add_alarm
    assert run(grammar, ['{"name": "add_alarm", "arguments": []']) is None  # an object only
    unfinished = run(grammar, ['{"name": "add", "arguments": {}}'])
    assert unfinished is not None and not unfinished.complete  # the call is not closed yet
    assert run(grammar, [good + "x"]) is None


def test_a_named_call_continues_from_its_arguments() -> None:
    grammar = tool_call(NAMES, named=True)  # the prompt already ends in `"arguments": `
    state = run(grammar, ['{"time": "7"}', "}", "\n", "</tool_call>"])
    assert state is not None and state.complete
    assert run(grammar, ['"7"']) is None


def test_what_a_request_asks_for() -> None:
    named = {"type": "function", "function": {"name": "add"}}
    assert for_request("required", NAMES, None) == tool_call(NAMES, named=False)
    assert for_request(named, NAMES, None) == tool_call(NAMES, named=True)
    assert for_request("auto", NAMES, None) is None
    assert for_request("auto", NAMES, "json_object") == JSON_OBJECT
    assert for_request(None, (), "text") is None
