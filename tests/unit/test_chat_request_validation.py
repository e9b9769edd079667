"""A chat request's tools and tool_choice are checked at the boundary: anything else reached
the model server and came back a 500 carrying the internal exception (issue 14)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.llm.openai_types import ChatRequest

names = st.text(min_size=1, max_size=20)
json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
anything = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _request(**fields: Any) -> bytes:
    return msgspec.json.encode({"model": "m", "messages": [], **fields})


@given(names, st.dictionaries(st.text(max_size=5), anything, max_size=3))
def test_a_function_tool_with_a_name_is_accepted(name: str, parameters: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": name, "parameters": parameters}}
    req = msgspec.json.decode(_request(tools=[tool], tool_choice="required"), type=ChatRequest)
    assert req.tools == [tool]


@given(anything)
def test_a_tool_that_is_not_a_named_function_is_refused(tool: Any) -> None:
    named = (
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
        and tool["function"]["name"] != ""
    )
    if named:
        return
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(_request(tools=[tool]), type=ChatRequest)


@pytest.mark.parametrize(
    "choice", ["maybe", {"type": "function"}, {"function": "x"}, {"function": {"name": 3}}]
)
def test_a_tool_choice_that_names_nothing_is_refused(choice: Any) -> None:
    with pytest.raises(msgspec.ValidationError, match="tool_choice"):
        msgspec.json.decode(_request(tool_choice=choice), type=ChatRequest)


@given(st.sampled_from(["max_tokens", "max_completion_tokens"]), st.integers(max_value=0))
def test_a_token_limit_below_one_is_refused(name: str, value: int) -> None:
    with pytest.raises(msgspec.ValidationError, match=f"{name} must be at least 1"):
        msgspec.json.decode(_request(**{name: value}), type=ChatRequest)


@given(st.integers(min_value=1))
def test_a_token_limit_of_one_or_more_is_taken(value: int) -> None:
    req = msgspec.json.decode(_request(max_completion_tokens=value), type=ChatRequest)
    assert req.max_completion_tokens == value
