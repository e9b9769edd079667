"""The LLM judge against the real counterpart of its fake: SmolLM2 behind `serve-model`. A 135M
model rarely writes the JSON asked for; whatever it writes, the judge must either return
validated capabilities or report the malformed output, never pass through unchecked text."""

from __future__ import annotations

import pytest

from services.contrast.judge import JudgeConfig, JudgeOutputError, JudgeProposer
from services.contrast.labels import Capability
from shared.llm.client import LLMClient
from shared.serving.engine import Engine
from tests.support.planted_trajectories import planted

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_judge_proposer_on_smollm2(llm: LLMClient, loaded: tuple[object, Engine]) -> None:
    _, engine = loaded
    batches = engine.stats.batches
    cfg = JudgeConfig(
        model="smollm2", max_tokens=48, max_attempts=2, max_prompt_chars=1600, examples_per_side=2
    )
    try:
        proposed = await JudgeProposer(llm, cfg).propose(
            planted(failed=6, succeeded=6), max_candidates=3
        )
    except JudgeOutputError as exc:
        assert "attempt" in str(exc).lower() or "json" in str(exc).lower(), str(exc)
    else:
        assert len(proposed) <= 3 and all(isinstance(c, Capability) for c in proposed)
    assert engine.stats.batches >= batches + 1  # the real server answered
