"""The serve-model engine batches requests whose cached prefixes differ (a synthetic
environment's episodes each have their own system turn) into one batch, prefilled whole, and
generates for each exactly what it would alone; requests sharing a prefix still share it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="serving needs the train extra")

from shared.serving.engine import Engine  # noqa: E402
from shared.serving.sampling import SamplingParams  # noqa: E402
from tests.support.tiny_model import smollm2_tokenizer, tiny_llama  # noqa: E402

pytestmark = [pytest.mark.slow]
GREEDY = SamplingParams(temperature=0, max_tokens=6, logprobs=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    tokenizer = smollm2_tokenizer()
    engine = Engine(tiny_llama(tokenizer).eval(), tokenizer, max_batch=16, batch_window=0.2)
    engine.start()
    yield engine
    engine.stop()


def prompt(system: int, user: int) -> tuple[list[int], int]:
    """Token ids of a system turn (one of several) and a user turn; the system turn's length."""
    head = [1] + [100 + system] * 40 + [2]
    return [*head, 300 + user, 301 + user, 302], len(head)


async def alone(engine: Engine, ids: list[int], prefix_len: int) -> Any:
    return (await engine.generate(ids, GREEDY, prefix_len=prefix_len))[0]


async def test_requests_with_different_prefixes_share_one_batch(engine: Engine) -> None:
    prompts = [prompt(system, user) for system in range(4) for user in range(2)]
    expected = [await alone(engine, ids, n) for ids, n in prompts]
    batches = engine.stats.batches
    together = await asyncio.gather(
        *(engine.generate(ids, GREEDY, prefix_len=n) for ids, n in prompts)
    )
    assert engine.stats.batches == batches + 1  # 8 requests, 4 prefixes: one batch
    for want, [got] in zip(expected, together, strict=True):
        assert got.token_ids == want.token_ids
        for a, b in zip(want.logprobs, got.logprobs, strict=True):
            assert abs(a.logprob - b.logprob) < 1e-4


async def test_requests_sharing_a_prefix_still_use_its_cache(engine: Engine) -> None:
    prompts = [prompt(9, user) for user in range(4)]
    hits = engine.stats.prefix_hits
    together = await asyncio.gather(
        *(engine.generate(ids, GREEDY, prefix_len=n) for ids, n in prompts)
    )
    assert engine.stats.prefix_hits == hits + 4
    for (ids, _), [got] in zip(prompts, together, strict=True):
        assert got.token_ids == (await alone(engine, ids, 0)).token_ids
