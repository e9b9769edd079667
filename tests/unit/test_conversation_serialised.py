"""What a conversation's tip hashes: msgspec writes a message, and its bytes must be the
ones `json.dumps(canonical(m), sort_keys=True, ensure_ascii=False)` gives (the tips stored
since the router began were hashed from those), for any message and any tool arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from services.router import conversations
from services.router.conversations import canonical, serialised


def reference(message: dict[str, Any]) -> bytes:
    text = json.dumps(canonical(message), sort_keys=True, ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def test_every_code_point_is_written_as_json_writes_it() -> None:
    # escaping is one character at a time: one string holding them all says it for each
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert conversations._TEXT.encode(every) == conversations._CANONICAL.encode(every).encode()


anything = st.characters(codec=None, exclude_categories=())  # lone surrogates too
text = st.text(anything, max_size=30) | st.text(max_size=30)
numbers = (
    st.integers()
    | st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**4299 - 1, -(10**4299) + 1])  # past int64
    | st.floats()  # NaN and infinities included: json writes them, msgspec refuses them
    | st.sampled_from([0.0, -0.0, 1e16, 1e-7, 1e22, 5e-324, 1.7976931348623157e308, 0.1])
)
values = st.recursive(
    st.none() | st.booleans() | numbers | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
written = st.builds(
    lambda v, ascii_only, indent, pad: (
        pad + json.dumps(v, ensure_ascii=ascii_only, indent=indent) + pad
    ),
    values,
    st.booleans(),
    st.sampled_from([None, 0, 2]),
    st.sampled_from(["", " ", "\n\t", "\r\n "]),
)
edges = st.sampled_from(
    [
        "1" * 4300,  # the longest integer Python reads
        "-" + "1" * 4300,
        "1" * 4301,  # one it refuses
        "1e400",  # past a float: infinity
        "-1e400",
        "NaN",
        "[Infinity, -Infinity]",
        '"\\ud800"',  # an escaped lone surrogate
        '{"\\udfff": 1}',
        '{"a": 1, "a": 2}',  # a key twice: the last
        '{"b": 1, "a": {"d": [1.5, 2E3, -0], "c": 1.0e+1}}',
        "\ufeff{}",  # a byte order mark: not JSON to json.loads
        "[" * 3000 + "]" * 3000,  # deeper than either reads
        "[1,]",
        "01",
        "1.",
        ".5",
        "",
        "nul\x00l",
        '"a\x01b"',  # a raw control character in a string: not JSON
    ]
)
arguments = written | text | edges | st.integers().map(str)
call = st.fixed_dictionaries(
    {"id": text, "type": st.just("function")},
    optional={
        "function": st.none()
        | st.fixed_dictionaries(
            {},
            optional={
                "name": text | st.none() | st.integers(),
                "arguments": arguments | st.none() | values,
            },
        )
    },
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool"]) | text | st.none(),
        "content": text
        | st.none()
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
        | values,
        "tool_calls": st.none() | st.lists(call, max_size=3),
        "tool_call_id": text,
        "name": text,
    },
)


@given(message)
@example({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "1e16"}}]})
@example({"role": "user", "content": "\ud800"})
@example({"role": "assistant", "tool_calls": [{"function": {"name": "\udc00", "arguments": "1"}}]})
def test_a_message_is_written_as_json_writes_it(message: dict[str, Any]) -> None:
    assert serialised(message) == reference(message)


def _calling(arguments: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": arguments}}],
    }


def test_deeply_nested_arguments_are_written_as_json_writes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for depth in [*range(150, 700, 7), 3000]:  # 3000: past the recursion limit, a string
        for opening, closing in (("[", "]"), ('{"a":', "}")):
            message = _calling(opening * depth + "1" + closing * depth)
            assert serialised(message) == reference(message)
    # msgspec read a few levels deeper than json.loads before the recursion limit (992 to
    # 995 from a script's top level, where json's text became a string; a review found
    # it): whatever may be nested that deep is read by json alone. (Near the limit json's
    # own answer depends on the caller's stack, so comparing there says nothing.)
    read: list[str] = []

    class Counted:
        def decode(self, raw: str) -> Any:
            read.append(raw)
            return json.loads(raw)

    monkeypatch.setattr(conversations, "_ARGUMENTS", Counted())
    within = "[" * conversations._FAST_BRACKETS + "]" * conversations._FAST_BRACKETS
    assert serialised(_calling(within)) == reference(_calling(within)) and read == [within]
    for deeper in ("[" + within + "]", '{"a": ' + within + "}", "[" * 995 + "]" * 995):
        assert serialised(_calling(deeper)) == reference(_calling(deeper))
    assert read == [within]


@given(arguments)
def test_tool_arguments_are_written_as_json_writes_them(arguments: str) -> None:
    message = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": arguments}}],
    }
    assert serialised(message) == reference(message)
