"""What the router keeps of a whole reply (`handlers._assistant`): an OpenAI assistant
message, or a TypeError (the relay's 502 for a malformed reply). A message of another shape
(text where an object goes, tool calls that are not objects naming a function) was taken,
and the turn's hash then raised after the reply was made: a 500, and the reply lost."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.conversations import History
from services.router.handlers import _assistant

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["content", "tool_calls", "function", "name", "arguments", "id"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
HISTORY = History([{"role": "user", "content": "hi"}])


@given(json_values)
def test_any_message_is_kept_whole_or_refused_before_the_reply_goes(message: Any) -> None:
    try:
        reply = _assistant(message)
    except TypeError:
        return
    assert reply["role"] == "assistant"
    assert HISTORY.tip_with(reply)  # the turn's hash takes it


@pytest.mark.parametrize(
    "message",
    [
        "hello",
        {"content": 3},
        {"content": None, "tool_calls": {"a": 1}},
        {"content": None, "tool_calls": [1]},
        {"content": None, "tool_calls": [{"function": "f"}]},
    ],
)
def test_a_message_of_another_shape_is_refused(message: Any) -> None:
    with pytest.raises(TypeError):
        _assistant(message)


def test_an_assistant_message_is_kept() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert _assistant({"content": None, "tool_calls": [call], "refusal": None}) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call],
    }
    assert _assistant({"content": "Done."}) == {"role": "assistant", "content": "Done."}
