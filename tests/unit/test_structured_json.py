"""Reading a model's JSON reply: the whole reply, a fenced block, or a complete object the
reply opens with before something else (a stray brace, a sentence), always validated
against the expected shape; anything else is a `MalformedReply`, never another error."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.llm.structured import MalformedReply, decode_json


class Item(msgspec.Struct, frozen=True):
    name: str
    score: float


items = st.builds(
    Item, name=st.text(max_size=40), score=st.floats(allow_nan=False, allow_infinity=False)
)


@given(items)
def test_a_whole_reply_and_a_fenced_one_are_read(item: Item) -> None:
    text = msgspec.json.encode(item).decode()
    assert decode_json(text, Item) == item
    assert decode_json(f"```json\n{text}\n```", Item) == item


@given(items, st.text(max_size=60))
def test_a_complete_object_followed_by_anything_is_read(item: Item, tail: str) -> None:
    assert decode_json(msgspec.json.encode(item).decode() + tail, Item) == item


def test_the_replies_small_models_wrote_are_read() -> None:
    # Qwen2.5-Coder-0.5B as the judge closed its object twice
    reply = '{"capabilities": [{"name": "a", "definition": "b"}]}}'
    assert decode_json(reply, dict) == {"capabilities": [{"name": "a", "definition": "b"}]}
    assert decode_json('{"name": "x", "score": 1}\nHope this helps!', Item) == Item("x", 1.0)


@pytest.mark.parametrize(
    "reply",
    [
        'Sure: {"name": "x", "score": 1}',  # prose first: not taken apart
        '{"name": "x", "score": 1',  # cut off
        '{"name": "x"} }',  # complete, but the wrong shape
        '[{"name": "x", "score": 1}]',
        "",
    ],
)
def test_what_cannot_be_read_is_a_malformed_reply(reply: str) -> None:
    with pytest.raises(MalformedReply):
        decode_json(reply, Item)


@given(st.text(max_size=200))
def test_any_text_gives_a_value_or_a_malformed_reply(reply: str) -> None:
    with contextlib.suppress(MalformedReply):
        decode_json(reply, Item)
