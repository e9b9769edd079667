"""The classifier routing mode against SmolLM2 behind `serve-model` (its fake's real
counterpart): one token with top log-probabilities comes back and becomes a decision."""

from __future__ import annotations

import uuid

import pytest

from shared.llm.client import LLMClient
from shared.routing.modes import Candidate, ClassifierRouting

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_classifier_on_smollm2(llm: LLMClient) -> None:
    alarms = Candidate(uuid.uuid4(), "a1", "set_alarms", ("Set an alarm at the asked time.",))
    texts = Candidate(uuid.uuid4(), "t1", "send_texts", ("Text a contact a message.",))
    router = ClassifierRouting(llm, "smollm2", min_confidence=0.0)
    decision = await router.decide("Wake me up at 6:30 tomorrow.", [alarms, texts])
    assert decision.mode == "classifier"
    assert set(decision.scores) <= {"a1", "t1"}
    assert sum(decision.scores.values()) <= 1.0 + 1e-9
    assert 0.0 <= decision.confidence <= 1.0
