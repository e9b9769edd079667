"""Merging near-duplicate capabilities, so one weakness does not get two adapters.

Two capabilities are duplicates when their texts (name and definition) are very similar,
when the failures they cover overlap strongly, or when both are moderately true (related
texts about the same failures). Of a group of duplicates the one with the highest mean delta
stays, with the others' names recorded in its `merged`.

Text similarity is a plug point (`Similarity`). The contrast service uses sentence
embeddings (`shared.embeddings`, all-MiniLM-L6-v2) when installed and token Jaccard
otherwise; each has its own thresholds (`MergeConfig.for_embeddings` / `for_tokens`),
because cosines of unrelated sentences sit much higher than word overlaps.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from services.contrast.criterion import CapabilityStats, rank_key

_STOPWORD_TEXT = """
a an and are as at be by every for from in into is it its no not of on or so some such than
that the their then this to was were when with
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


class Similarity(Protocol):
    """Similarity of two texts in [0, 1] (1: the same meaning)."""

    def __call__(self, a: str, b: str, /) -> float: ...


def tokens(text: str) -> frozenset[str]:
    """Lowercased words (snake_case split), stopwords dropped, a plural 's' stripped."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return frozenset(
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        for w in words
        if w not in _STOPWORDS
    )


def jaccard(a: Collection[str], b: Collection[str]) -> float:
    """|a & b| / |a | b|; 0.0 when both are empty (nothing shared is no evidence)."""
    union = set(a) | set(b)
    return len(set(a) & set(b)) / len(union) if union else 0.0


def token_jaccard(a: str, b: str) -> float:
    """The default `Similarity`: Jaccard of the texts' normalised word sets."""
    return jaccard(tokens(a), tokens(b))


@dataclass(frozen=True)
class MergeConfig:
    min_text_similarity: float = 0.5
    """Texts at least this similar are duplicates."""
    min_failure_overlap: float = 0.8
    """Jaccard of `failures_covered` at which two capabilities are duplicates."""
    related_text_similarity: float = 0.3
    """Texts at least this similar are duplicates when their failures also overlap by
    `related_failure_overlap`."""
    related_failure_overlap: float = 0.5

    @classmethod
    def for_tokens(cls) -> MergeConfig:
        """Thresholds for `token_jaccard`."""
        return cls()

    @classmethod
    def for_embeddings(cls) -> MergeConfig:
        """Thresholds for MiniLM cosines: paraphrased definitions score 0.5-0.85, the
        catalogue's distinct capabilities at most 0.73 (measured; see the unit tests)."""
        return cls(min_text_similarity=0.8, related_text_similarity=0.5)


def duplicates(
    a: CapabilityStats,
    b: CapabilityStats,
    similarity: Similarity = token_jaccard,
    cfg: MergeConfig | None = None,
) -> bool:
    """Whether two capabilities name the same weakness (text or covered failures)."""
    cfg = cfg or MergeConfig()
    overlap = jaccard(a.failures_covered, b.failures_covered)
    if overlap >= cfg.min_failure_overlap:
        return True
    text = similarity(_text(a), _text(b))
    if text >= cfg.min_text_similarity:
        return True
    return text >= cfg.related_text_similarity and overlap >= cfg.related_failure_overlap


def merge(
    stats: Sequence[CapabilityStats],
    similarity: Similarity = token_jaccard,
    cfg: MergeConfig | None = None,
) -> list[CapabilityStats]:
    """One capability per group of duplicates, ranked by mean delta.

    Greedy in rank order: each capability joins the first kept one it duplicates (that one
    has the higher mean delta), else it is kept itself. Stats are not pooled: the survivor's
    numbers are its own labels', only its `merged` names grow."""
    cfg = cfg or MergeConfig()
    kept: list[CapabilityStats] = []
    for candidate in sorted(stats, key=rank_key):
        for i, survivor in enumerate(kept):
            if duplicates(survivor, candidate, similarity, cfg):
                names = [*survivor.merged, candidate.name, *candidate.merged]
                kept[i] = msgspec.structs.replace(survivor, merged=names)
                break
        else:
            kept.append(candidate)
    return kept


def _text(stats: CapabilityStats) -> str:
    return capability_text(stats.name, stats.definition)


def capability_text(name: str, definition: str) -> str:
    """What similarity compares: the name in words, then the definition."""
    return f"{name.replace('_', ' ')}: {definition}"
