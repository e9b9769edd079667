"""The serve-model engine batches requests whatever their prompts, generates for each exactly
what it would alone, starts a conversation's next turn from the keys and values its last turn
left, and lets requests that arrive while a batch decodes join it."""

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


def running(**settings: Any) -> Iterator[Engine]:
    tokenizer = smollm2_tokenizer()
    engine = Engine(tiny_llama(tokenizer).eval(), tokenizer, **settings)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    yield from running(max_batch=16, batch_window=0.2)


@pytest.fixture(scope="module")
def uncached() -> Iterator[Engine]:
    """The same weights with no key/value store: every prompt runs whole, alone."""
    yield from running(max_batch=1, kv_budget_bytes=0)


def prompt(system: int, user: int) -> list[int]:
    """Token ids of a system turn (one of several) and a user turn."""
    return [1, *[100 + system] * 40, 2, 300 + user, 301 + user, 302]


async def alone(engine: Engine, ids: list[int], params: SamplingParams = GREEDY) -> Any:
    return (await engine.generate(ids, params))[0]


def same(want: Any, got: Any) -> None:
    assert got.token_ids == want.token_ids
    for a, b in zip(want.logprobs, got.logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 1e-4


async def test_requests_with_different_prompts_share_one_batch(
    engine: Engine, uncached: Engine
) -> None:
    prompts = [prompt(system, user) for system in range(4) for user in range(2)]
    expected = [await alone(uncached, ids) for ids in prompts]
    batches, hits = engine.stats.batches, engine.stats.prefix_hits
    together = await asyncio.gather(*(engine.generate(ids, GREEDY) for ids in prompts))
    assert engine.stats.batches == batches + 1  # 8 requests: one batch
    assert engine.stats.prefix_hits >= hits + 4  # each system turn's second user reused it
    for want, [got] in zip(expected, together, strict=True):
        same(want, got)


async def test_the_next_turn_starts_where_the_last_one_ended(
    engine: Engine, uncached: Engine
) -> None:
    first = prompt(7, 0)
    reply = await alone(engine, first)
    second = [*first, *reply.token_ids, 400, 401, 402]
    prefilled = engine.stats.prefilled_tokens
    got = await alone(engine, second)
    # the reply's last token was never fed (it was the last sampled): it runs with the new turn
    assert engine.stats.prefilled_tokens - prefilled <= 4
    same(await alone(uncached, second), got)


async def test_a_request_arriving_mid_batch_joins_it(engine: Engine, uncached: Engine) -> None:
    long = SamplingParams(temperature=0, max_tokens=300, logprobs=True)
    early, late = prompt(11, 0), prompt(12, 0)
    expected = [await alone(uncached, early, long), await alone(uncached, late)]
    joined = engine.stats.joined
    decoding = asyncio.Event()
    first = asyncio.ensure_future(engine.generate(early, long, on_delta=lambda _: decoding.set()))
    await decoding.wait()  # the first batch is decoding
    second = await alone(engine, late)
    assert not first.done()  # it was answered from the running batch
    same(expected[1], second)
    same(expected[0], (await first)[0])
    assert engine.stats.joined == joined + 1


async def test_sampled_rows_reproduce_with_their_seed(engine: Engine, uncached: Engine) -> None:
    sampled = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=8, seed=5)
    ids = prompt(20, 1)
    want = await uncached.generate(ids, sampled, n=3)
    got = await engine.generate(ids, sampled, n=3)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_waiting_requests_of_another_adapter_stop_joins(engine: Engine) -> None:
    loop = asyncio.new_event_loop()
    try:
        from shared.serving.engine import Request

        def request(adapter: str | None) -> Request:
            return Request([1, 2, 3], adapter, GREEDY, 1, loop, loop.create_future(), None, [None])

        mine, theirs = request(None), request("other")
        engine._pending.extend([mine])
        assert engine._joiners(None, 1) == [mine]
        engine._pending.extend([request(None), theirs])
        assert engine._joiners(None, 1) == []  # the batch drains; "other" goes next
        assert engine._joiners(None, 16) == []
        engine._pending.clear()
    finally:
        loop.close()


async def test_a_grammar_holds_each_row_to_what_it_allows(engine: Engine) -> None:
    """Rows of one batch, each with its own grammar (or none), sampled: the tiny random
    model's replies follow their grammar token by token and stop when it is whole."""
    import dataclasses
    import json

    from shared.serving.constrain import JSON_OBJECT, Grammar, Literal, OneOf

    sampled = SamplingParams(temperature=1.0, max_tokens=60, seed=9)
    exact = Grammar((Literal("hello "), OneOf(("world", "there"))))
    asks = [
        engine.generate(prompt(40, 0), dataclasses.replace(sampled, grammar=exact), n=3),
        engine.generate(prompt(41, 0), dataclasses.replace(sampled, grammar=JSON_OBJECT), n=4),
        engine.generate(prompt(42, 0), sampled),
    ]
    words, objects, [free] = await asyncio.gather(*asks)
    assert {o.text for o in words} <= {"hello world", "hello there"}
    assert all(o.finish_reason == "stop" and o.stop_token is None for o in words)
    for o in objects:
        state = JSON_OBJECT.start().fed(o.text)
        assert state is not None, o.text  # whatever was written so far is a valid start
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict)
    assert not free.text.startswith("hello ")  # a row without a grammar is left alone
