"""The spec writer against the real counterpart of its fake: SmolLM2 behind `serve-model`.
A 135M model will not write a working template; the writer must either return a checked spec
or report what was wrong, never pass an unchecked one on."""

from __future__ import annotations

import pytest

from services.synthesize.writer import SpecWriter, SpecWriterError, WriterConfig
from shared.envs.synthetic import check_deterministic, toolbox_schemas, validate
from shared.llm.client import LLMClient
from shared.serving.engine import Engine

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_spec_writer_on_smollm2(llm: LLMClient, loaded: tuple[object, Engine]) -> None:
    _, engine = loaded
    batches = engine.stats.batches
    writer = SpecWriter(llm, WriterConfig(model="smollm2", max_tokens=64, max_attempts=2))
    try:
        spec = await writer.write(
            "look_up_before_acting", "Search contacts before texting someone by first name."
        )
    except SpecWriterError as exc:
        assert "attempt 2" in str(exc), str(exc)  # both replies were judged, and said why
        assert engine.stats.batches > batches  # the real server answered
    else:
        assert validate(spec, toolbox_schemas()) == []
        assert check_deterministic(spec, range(2)) == []
        assert engine.stats.batches >= batches + 1
