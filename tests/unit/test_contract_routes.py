"""Every contract's docstring says who consumes it ("producer -> consumers: what"); the
services' handler tables must say the same, so no contract claims a consumer that ignores it
and none is consumed behind its docstring's back."""

from __future__ import annotations

import re

import pytest

from shared.messages import Contract, contracts
from tests.support.services import BUILDERS, built

# the router in base mode: no embedding model to load for this check
BUILT = {name: built(name, {"RETRACE_ROUTER_MODE": "base"}) for name in BUILDERS}
OURS = [c for c in contracts() if c.__module__ == "shared.messages"]
"""retrace's own contracts (tests register contracts of their own)."""
ROUTE = re.compile(r"^(?P<producers>[^:]+?)\s*->\s*(?P<consumers>[^:(]+?)\s*(\([^)]*\))?\s*:")


def declared_consumers(contract: type[Contract]) -> set[str]:
    line = " ".join((contract.__doc__ or "").split())
    match = ROUTE.match(line)
    assert match, f"{contract.__name__}'s docstring does not open with 'producer -> consumers:'"
    names = {n.strip() for n in re.split(r"[,/]", match["consumers"])}
    return names & set(BUILDERS)


@pytest.mark.parametrize("contract", OURS, ids=lambda c: c.kind())
def test_the_docstring_names_exactly_the_services_that_consume_it(
    contract: type[Contract],
) -> None:
    actual = {name for name, service in BUILT.items() if contract in service.handlers}
    assert declared_consumers(contract) == actual


def test_every_contract_has_a_consumer_or_says_it_is_for_outside() -> None:
    for contract in OURS:
        outside = "subscribers outside retrace" in (contract.__doc__ or "")
        assert declared_consumers(contract) or outside, contract.__name__
