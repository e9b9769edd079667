"""Adapter names on the shared inference endpoint are tenant-qualified (issue 14: one global
namespace): the tenant first, then `/`, so no two tenants' adapters share a name, whatever
their agents and skills are called."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import ContractError
from shared.store.tenants import adapter_name
from shared.subjects import TENANT_RE

tenants = st.from_regex(TENANT_RE, fullmatch=True)
free_text = st.text(max_size=20)


@given(tenants, tenants, free_text, free_text, free_text, free_text, st.uuids(), st.uuids())
def test_two_tenants_never_share_an_adapter_name(
    a: str,
    b: str,
    agent_a: str,
    agent_b: str,
    skill_a: str,
    skill_b: str,
    ja: uuid.UUID,
    jb: uuid.UUID,
) -> None:
    first = adapter_name(a, agent_a, skill_a, 1, ja)
    second = adapter_name(b, agent_b, skill_b, 1, jb)
    assert first.startswith(f"{a}/") and second.startswith(f"{b}/")
    assert first.split("/", 1)[0] == a  # a tenant id holds no `/`: the prefix is the tenant
    if a != b:
        assert first != second


def test_a_name_is_not_made_for_an_invalid_tenant() -> None:
    with pytest.raises(ContractError):
        adapter_name("Acme/other", "bot", "skill", 1, uuid.uuid4())
