"""Merging near-duplicate capabilities, so one weakness does not get two adapters.

Two capabilities are duplicates when their texts (name and definition) are similar, or when
the failures they cover overlap strongly. Of a group of duplicates the one with the highest
mean delta stays, with the others' names recorded in its `merged`. Text similarity is a plug
point (`Similarity`): the default is token Jaccard, an embedding model can replace it.
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


def duplicates(
    a: CapabilityStats,
    b: CapabilityStats,
    similarity: Similarity = token_jaccard,
    cfg: MergeConfig | None = None,
) -> bool:
    """Whether two capabilities name the same weakness (text or covered failures)."""
    cfg = cfg or MergeConfig()
    if jaccard(a.failures_covered, b.failures_covered) >= cfg.min_failure_overlap:
        return True
    return similarity(_text(a), _text(b)) >= cfg.min_text_similarity


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
    return f"{stats.name.replace('_', ' ')} {stats.definition}"
