"""The real all-MiniLM-L6-v2: loads offline, and its cosines fit the merge thresholds."""

from __future__ import annotations

import itertools
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.contrast.deterministic import CATALOGUE
from services.contrast.merge import MergeConfig, capability_text, merge
from shared import embeddings
from tests.unit.test_contrast_merge import stats

pytestmark = [pytest.mark.model, pytest.mark.slow]

if not embeddings.available():
    pytest.skip("the embedding model needs the train extra", allow_module_level=True)


@pytest.fixture(scope="module")
def sim() -> embeddings.EmbeddingSimilarity:
    return embeddings.EmbeddingSimilarity(embeddings.default_embedder())


def test_vectors_are_unit_length_and_deterministic() -> None:
    embedder = embeddings.MiniLM()
    [a, b] = embedder.embed(["look up the contact first", "look up the contact first"])
    assert len(a) == 384
    assert embeddings.cosine(a, a) == pytest.approx(1.0, abs=1e-5)
    assert a == b


def test_the_cache_forgets_the_least_recently_used_and_is_safe_across_threads() -> None:
    """It used to clear itself whole when full (every profile text re-embedded at once), and
    a thread could clear it between another's insert and read (a KeyError in routing)."""
    embedder = embeddings.MiniLM(cache_size=4)
    embedder.embed(["a", "b", "c", "d"])
    embedder.embed(["a"])
    embedder.embed(["e"])
    assert list(embedder._cache) == ["c", "d", "a", "e"]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda i: embedder.embed([f"text {i}", f"more {i}", "a"]), range(40)))
    assert all(len(vectors) == 3 for vectors in done) and len(embedder._cache) == 4
    # The same text, the same vector, cached or not: equal to float32 rounding, since a text
    # embedded in a batch of another length may be summed in another order (CI saw 4e-8).
    assert done[0][2] == pytest.approx(done[-1][2], abs=1e-6)


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory whose static table one instance built (10 s, once for the module)."""
    directory = tmp_path_factory.mktemp("embeddings")
    fresh = embeddings.StaticMiniLM(directory)
    assert not fresh.ready
    fresh.embed(["build it"])
    assert fresh.ready
    return directory


def test_static_vectors_are_built_once_and_read_like_minilm(static_dir: Path) -> None:
    """The router's optional similarity (issue 14): MiniLM's token vectors, averaged."""
    [table] = list(static_dir.glob("static-minilm-l6-v2-*.npy"))
    built = table.stat().st_mtime_ns
    static = embeddings.StaticMiniLM(static_dir)
    alarm, wake, refund = static.embed(
        ["set an alarm for seven", "wake me up at 7 with an alarm", "refund my order please"]
    )
    assert table.stat().st_mtime_ns == built  # read, not built again
    assert len(alarm) == 384
    assert embeddings.cosine(alarm, alarm) == pytest.approx(1.0, abs=1e-5)
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(alarm, refund)
    assert static.embed(["set an alarm for seven"]) == [alarm]
    assert static.embed([""]) == [[0.0] * 384]  # no token: similar to nothing
    assert not list(static_dir.glob("*.partial.npy"))


async def test_a_loaded_static_embedder_is_called_on_the_loop(static_dir: Path) -> None:
    static = embeddings.StaticMiniLM(static_dir)
    batched = embeddings.Batched(static)
    first = await batched.embed(["set an alarm"])  # the load: on a thread, as one batch
    assert batched.batches == 1 and static.ready
    assert await batched.embed(["set an alarm"]) == first
    assert batched.batches == 1  # quick now: embedded directly, no thread


def test_the_learned_static_table_gives_vectors_near_minilm_s(static_dir: Path) -> None:
    """The shipped learned rows (`shared.routing.learned_table`) over the plain table: a
    request's vector near MiniLM's own where the plain table's is not, and unrelated
    requests apart where the plain table puts them together (issue 14)."""
    texts = [
        "Please set an alarm for 7:30 tomorrow called 'Gym'.",
        "wake me up at seven with an alarm",
        "I want a refund for order W2000, it arrived broken.",
        "Who painted the Mona Lisa?",
        "How much is 300 euros in yen?",
    ]
    reference = embeddings.MiniLM().embed(texts)
    plain = embeddings.StaticMiniLM(static_dir).embed(texts)
    learned = embeddings.LearnedStatic(cache_dir=static_dir)
    assert not learned.ready
    vectors = learned.embed(texts)
    assert learned.ready
    near = [embeddings.cosine(a, b) for a, b in zip(vectors, reference, strict=True)]
    far = [embeddings.cosine(a, b) for a, b in zip(plain, reference, strict=True)]
    # measured: 0.66 to 0.89 learned, 0.29 to 0.61 plain
    assert min(near) > 0.6 and sum(near) / len(near) > sum(far) / len(far) + 0.2
    alarm, wake, refund, painting, _ = vectors
    assert embeddings.cosine(alarm, refund) < 0.3  # plain: 0.67, MiniLM: 0.06
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(alarm, refund)
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(alarm, painting)


@pytest.mark.skipif(not embeddings.onnx_available(), reason="ONNX Runtime not installed")
def test_onnx_runtime_gives_minilm_s_own_vectors_and_int8_close_ones(tmp_path: Path) -> None:
    """Routing's MiniLM through ONNX Runtime (issue 14: PyTorch's cost per operator was most
    of a short text's 13 to 18 ms): the graph exported once, the same vectors; its int8
    twin close to them, and apart where MiniLM is."""
    texts = ["set an alarm for seven", "wake me up at 7 with an alarm", "refund my order please"]
    reference = embeddings.MiniLM().embed(texts)
    onnx = embeddings.OnnxMiniLM(tmp_path)
    vectors = onnx.embed(texts)
    [graph] = list(tmp_path.glob("minilm-l6-v2-*.onnx"))
    for got, want in zip(vectors, reference, strict=True):
        assert embeddings.cosine(got, want) == pytest.approx(1.0, abs=1e-5)
    # fused: each layer's attention one operator, the embeddings' sum and norm one
    assert _operators(graph)["Attention"] == 6
    assert _operators(graph)["EmbedLayerNormalization"] == 1
    assert onnx.embed(texts[:1]) == vectors[:1]  # from its cache
    int8 = embeddings.OnnxMiniLM(tmp_path, int8=True, cache_size=0)
    small = int8.embed(texts)
    [small_graph] = tmp_path.glob("*.int8-per-channel.onnx")
    assert graph.exists() and _operators(small_graph)["QAttention"] == 6
    # each residual's add and norm left to LayerNormalization, in the file and as the session
    # runs it: ONNX Runtime's SkipLayerNormalization was a tenth of a query (session 25)
    for own in (graph, small_graph):
        assert _operators(own)["SkipLayerNormalization"] == 0
        assert _operators(own)["LayerNormalization"] == 12
    assert _as_run(small_graph, embeddings.SESSION_UNFUSED)["SkipLayerNormalization"] == 0
    assert _as_run(small_graph, [])["SkipLayerNormalization"] == 12  # what the list is for
    assert not list(tmp_path.glob("*.partial*"))
    for got, want in zip(small, reference, strict=True):
        # a scale per output channel: 0.93 at worst with one per matrix (session 13's)
        assert embeddings.cosine(got, want) > 0.97
    alarm, wake, refund = small
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(alarm, refund)
    # its activations take one scale per input: alone, a text is the same every time; among
    # others, close to that (routing batches the queries that arrive together under load)
    alone = [int8.embed([t])[0] for t in texts]
    assert alone == [int8.embed([t])[0] for t in texts]
    for got, want in zip(small, alone, strict=True):
        assert embeddings.cosine(got, want) > 0.98


@pytest.mark.skipif(not embeddings.onnx_available(), reason="ONNX Runtime not installed")
def test_the_distilled_query_encoder_gives_vectors_close_to_minilm_s(tmp_path: Path) -> None:
    """The shipped distilled query encoder (`shared.routing.query_encoder`): its int8 graph
    made once from the installed MiniLM and the shipped layers, named by their digest; its
    vectors of requests near MiniLM's, and apart where MiniLM's are."""
    from shared.routing import query_encoder

    texts = [
        "Please set an alarm for 7:30 tomorrow called 'Gym'.",
        "wake me up at seven with an alarm",
        "I want a refund for order W2000, it arrived broken.",
        "Who painted the Mona Lisa?",
    ]
    reference = embeddings.MiniLM().embed(texts)
    distilled = embeddings.OnnxMiniLM(tmp_path, int8=True, distilled=True)
    vectors = distilled.embed(texts)
    [graph] = tmp_path.glob(f"*.distilled-{query_encoder.digest()}.int8-per-channel.onnx")
    assert graph.stat().st_size < 20e6  # the token embeddings and two layers (MiniLM's: 23 MB)
    assert _operators(graph)["QAttention"] == 2
    # 0.78 to 0.84 for the weights of session 19 (0.99 for MiniLM's own int8 graph)
    for got, want in zip(vectors, reference, strict=True):
        assert embeddings.cosine(got, want) > 0.7
    alarm, wake, refund, painting = vectors
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(alarm, refund)
    assert embeddings.cosine(alarm, wake) > embeddings.cosine(wake, painting)


def test_the_static_vectors_read_the_tokens_transformers_reads() -> None:
    """The static vectors tokenize through the Rust tokenizer itself (transformers' Python
    around it cost 0.1 ms a request), not padded: the packaged tokenizer.json pads to 128,
    which made every text mostly [PAD] vectors when first switched."""
    tokenizer = embeddings.MiniLM()._load().tokenizer
    texts = ["Set an alarm for 7:10 labelled gym.", "word " * 400, "\u00e9t\u00e9 \u65e5\u672c", ""]
    want = tokenizer(
        texts, add_special_tokens=False, truncation=True, max_length=embeddings.MAX_TOKENS
    )["input_ids"]
    got = [e.ids for e in embeddings._tokenizer().encode_batch(texts, add_special_tokens=False)]
    assert got == want


def test_the_catalogue_has_no_embedding_duplicates(sim: embeddings.EmbeddingSimilarity) -> None:
    threshold = MergeConfig.for_embeddings().min_text_similarity
    for a, b in itertools.combinations(CATALOGUE, 2):
        score = sim(capability_text(a.name, a.definition), capability_text(b.name, b.definition))
        assert score < threshold, (a.name, b.name, score)


def test_paraphrases_merge_and_distinct_skills_do_not(sim: embeddings.EmbeddingSimilarity) -> None:
    cfg = MergeConfig.for_embeddings()
    recover = stats(
        "recover_from_tool_errors", "Retry a failed tool call until it works.", 0.5, ["f1"]
    )
    handle = stats(
        "handle_tool_failures",
        "When a tool returns an error, fix the call and try again.",
        0.3,
        ["f9"],
    )
    ask = stats(
        "ask_for_missing_information",
        "Ask the user when a required detail is missing.",
        0.4,
        ["f2", "f3", "f4"],
    )
    clarify = stats(
        "request_clarification",
        "Query the user for details the task did not give before acting.",
        0.2,
        ["f3", "f4", "f5"],
    )
    report = stats("report_result_to_user", "Tell the user what was done.", 0.35, ["f3", "f4"])
    merged = {s.name: s.merged for s in merge([recover, handle, ask, clarify, report], sim, cfg)}
    assert merged == {
        "recover_from_tool_errors": ["handle_tool_failures"],  # the same text, by meaning
        "ask_for_missing_information": ["request_clarification"],  # related, same failures
        "report_result_to_user": [],  # shares failures with `ask`, but a different skill
    }


def _as_run(graph: Path, unfused: list[str]) -> Counter[str]:
    """The operators of `graph` once an ONNX Runtime session has optimised it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(graph.with_suffix(".as-run.onnx"))
    onnxruntime.InferenceSession(
        str(graph), options, providers=["CPUExecutionProvider"], disabled_optimizers=unfused
    )
    return _operators(graph.with_suffix(".as-run.onnx"))


def _operators(graph: Path) -> Counter[str]:
    import onnx

    return Counter(node.op_type for node in onnx.load(str(graph)).graph.node)
