"""Every contract's docstring says who consumes it ("producer -> consumers: what"); the
services' handler tables must say the same, so no contract claims a consumer that ignores it
and none is consumed behind its docstring's back."""

from __future__ import annotations

import re

import pytest

from services.contrast.config import ContrastConfig
from services.contrast.service import build as contrast
from services.evaluator.config import EvaluatorConfig
from services.evaluator.service import build as evaluator
from services.rollout.config import RolloutConfig
from services.rollout.service import build as rollout
from services.router.config import RouterConfig
from services.router.service import build as router
from services.synthesize.config import SynthesizeConfig
from services.synthesize.service import build as synthesize
from services.train.config import TrainConfig
from services.train.service import build as train
from shared.config import load_config
from shared.messages import Contract, contracts

SERVICES = {
    "rollout": lambda: rollout(load_config(RolloutConfig, env={})),
    "contrast": lambda: contrast(load_config(ContrastConfig, env={})),
    "synthesize": lambda: synthesize(load_config(SynthesizeConfig, env={})),
    "train": lambda: train(load_config(TrainConfig, env={})),
    "evaluator": lambda: evaluator(load_config(EvaluatorConfig, env={})),
    "router": lambda: router(load_config(RouterConfig, env={"RETRACE_ROUTER_MODE": "base"})),
}
BUILT = {name: make() for name, make in SERVICES.items()}
OURS = [c for c in contracts() if c.__module__ == "shared.messages"]
"""retrace's own contracts (tests register contracts of their own)."""
ROUTE = re.compile(r"^(?P<producers>[^:]+?)\s*->\s*(?P<consumers>[^:(]+?)\s*(\([^)]*\))?\s*:")


def declared_consumers(contract: type[Contract]) -> set[str]:
    line = " ".join((contract.__doc__ or "").split())
    match = ROUTE.match(line)
    assert match, f"{contract.__name__}'s docstring does not open with 'producer -> consumers:'"
    names = {n.strip() for n in re.split(r"[,/]", match["consumers"])}
    return names & set(SERVICES)


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
