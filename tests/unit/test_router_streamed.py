"""What the router keeps of a streamed reply (`handlers._Streamed`): the first choice of a
stream of several, the usage's completion tokens, and nothing from chunks of another shape
(one of those cut the relay off mid-stream with a TypeError)."""

from __future__ import annotations

import json
from typing import Any

from services.router.handlers import _Streamed


def line(chunk: Any) -> bytes:
    return b"data: " + json.dumps(chunk).encode()


def test_the_first_choice_and_the_usage_are_kept() -> None:
    streamed = _Streamed()
    for index, text in ((0, "Sure"), (1, "Another"), (0, ", done."), (1, " answer.")):
        streamed.fold(line({"choices": [{"index": index, "delta": {"content": text}}]}))
    call = {"index": 0, "id": "c1", "function": {"name": "set_", "arguments": '{"a"'}}
    streamed.fold(line({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
    more = {"index": 0, "function": {"name": "alarm", "arguments": ": 1}"}}
    streamed.fold(line({"choices": [{"index": 0, "delta": {"tool_calls": [more]}}]}))
    streamed.fold(line({"choices": [], "usage": {"completion_tokens": 7}}))
    streamed.fold(b"data: [DONE]")
    assert streamed.reply() == {
        "role": "assistant",
        "content": "Sure, done.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "set_alarm", "arguments": '{"a": 1}'},
            }
        ],
    }
    assert streamed.tokens == 7


def test_chunks_of_another_shape_are_passed_over() -> None:
    streamed = _Streamed()
    for odd in (
        {"choices": 1},
        {"choices": True},
        {"choices": {"index": 0}},
        {"choices": [{"index": 0, "delta": {"tool_calls": 5}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]},
        {"choices": [{"index": 0, "delta": "text"}]},
        [1, 2],
        "text",
    ):
        streamed.fold(line(odd))
    streamed.fold(b"data: {not json")
    streamed.fold(b": a comment")
    streamed.fold(b"data: \xff")
    assert streamed.reply() == {"role": "assistant", "content": None, "tool_calls": None}
    assert streamed.tokens == 0


def test_the_usage_is_read_as_a_whole_reply_s_is() -> None:
    for counted, tokens in ((7.0, 7), (True, 0), ("7", 0), (None, 0)):
        streamed = _Streamed()
        streamed.fold(line({"choices": [], "usage": {"completion_tokens": counted}}))
        assert streamed.tokens == tokens, counted


def test_a_whole_reply_s_usage_of_another_shape_counts_nothing() -> None:
    # a list or text where the usage goes raised in the relay, after the reply was made
    from services.router.handlers import _completion_tokens

    assert [_completion_tokens(u) for u in ({"completion_tokens": 3}, [], "7", None)] == [
        3,
        0,
        0,
        0,
    ]


def test_only_a_stream_ended_by_done_without_an_error_is_whole() -> None:
    """Session 32's second review: a stream the endpoint ended with an error event was
    recorded as a whole reply."""
    piece = line({"choices": [{"index": 0, "delta": {"content": "Par"}}]})
    failed = line({"error": {"message": "model was unloaded", "type": "not_found_error"}})
    for lines, whole in (
        ([piece, b"data: [DONE]"], True),
        ([piece], False),  # broken off: no [DONE]
        ([piece, failed], False),
        ([piece, failed, b"data: [DONE]"], False),
        ([piece, line({"error": None}), b"data: [DONE]"], True),
    ):
        streamed = _Streamed()
        for raw in lines:
            streamed.fold(raw)
        assert streamed.whole is whole, lines
