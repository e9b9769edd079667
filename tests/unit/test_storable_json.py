"""JSON values Postgres can store: U+0000 never reaches a JSONB column."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.store.models import storable_json, without_nul

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_no_nul_survives_and_nothing_else_changes(value: Any) -> None:
    stored = without_nul(value)
    text = json.dumps(stored)
    assert "\\u0000" not in text
    assert without_nul(stored) == stored
    if "\\u0000" not in json.dumps(value):
        assert stored == value


def test_a_nul_becomes_the_replacement_character() -> None:
    assert without_nul({"a\x00": ["x\x00y", 1]}) == {"a\ufffd": ["x\ufffdy", 1]}
    # a text that only looks like the escape is kept as it is
    assert storable_json({"k": ["a\\u0000", "b\x00"]}) == '{"k":["a\\\\u0000","b\ufffd"]}'


@given(json_values)
def test_the_stored_text_is_the_walked_values_whether_or_not_it_is_walked(value: Any) -> None:
    assert storable_json(value) == msgspec.json.encode(without_nul(value)).decode()
