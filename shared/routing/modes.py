"""Routing modes: which adapter (or the base model) a conversation goes to, and how sure.

A mode sees the first user turn and the agent's candidate adapters, each with a profile
(its capability's name and definition, requests from its training scenarios, and requests
of the failures the capability was diagnosed on), and returns a `Decision`. Every mode has
a confidence threshold below which the base model answers.

- `embedding`: cosine similarity of the first user turn to each profile's texts (nearest
  example), through all-MiniLM-L6-v2 (`shared.embeddings`), or first its static token
  vectors where they are sure; confidence is the best score.
- `classifier`: the base model picks a label (see `ClassifierRouting`).
- `base`: always the base model (routing off).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.embeddings import Batched, Embedder, cosine, routing_embedder
from shared.envs.protocol import Message
from shared.llm.client import LLMClient
from shared.llm.openai_types import ChatRequest


@dataclass(frozen=True)
class Candidate:
    adapter_id: uuid.UUID
    name: str
    """The adapter's name on the inference endpoint."""
    capability: str
    examples: tuple[str, ...]
    """Profile texts: the capability in words, training-scenario and failure requests."""


@dataclass(frozen=True)
class Decision:
    adapter: Candidate | None
    """None: the base model."""
    confidence: float
    mode: str
    scores: dict[str, float] = field(default_factory=dict)
    """Adapter name -> score."""

    def record(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "adapter": self.adapter.name if self.adapter else None,
            "confidence": round(self.confidence, 6),
            "scores": {k: round(v, 6) for k, v in self.scores.items()},
        }


class RoutingMode(Protocol):
    name: str

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision: ...


class BaseOnly:
    name = "base"

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        return Decision(None, 1.0, self.name)


PROFILE_MATRICES = 256
"""Profile matrices an embedding router keeps (one per production set it has seen)."""


class _Scorer:
    """One embedder's similarity of a query to each candidate's profile (its nearest
    example), the profiles' vectors kept as one matrix per production set. `profiles`
    embeds the profiles where it is not `embedder` (a slower, exact model: they are
    embedded once per production set, the queries once per conversation)."""

    def __init__(
        self,
        embedder: Embedder,
        profiles: Embedder | None = None,
        alone: Callable[[], bool] | None = None,
    ) -> None:
        self.embedder = embedder
        self._batched = Batched(embedder, alone)
        """CPU work (and the model's first load) off the event loop, concurrent requests'
        queries embedded together."""
        self._profile_batched = Batched(profiles) if profiles is not None else None
        self._profiles: dict[tuple[str, ...], Any] = {}
        """The examples' vectors as one matrix, by the examples (the profiles of an agent's
        production set change only with it)."""

    async def scores(self, query: str, candidates: Sequence[Candidate]) -> dict[str, float]:
        import numpy as np  # the embedding model's own dependency (the train extra)

        examples = tuple(e for c in candidates for e in c.examples)
        matrix = self._profiles.get(examples)
        if matrix is None:
            if self._profile_batched is None:
                q, *vectors = await self._batched.embed([query, *examples])
            else:
                [q], vectors = await asyncio.gather(
                    self._batched.embed([query]), self._profile_batched.embed(examples)
                )
            matrix = np.asarray(vectors, dtype=np.float32).reshape(len(examples), -1)
            if len(self._profiles) >= PROFILE_MATRICES:
                self._profiles.clear()
            self._profiles[examples] = matrix
        else:
            [q] = await self._batched.embed([query])
        similarity = matrix @ np.asarray(q, dtype=np.float32)  # unit vectors: the cosines
        scores: dict[str, float] = {}
        start = 0
        for c in candidates:
            own = similarity[start : start + len(c.examples)]
            scores[c.name] = float(own.max()) if len(own) else 0.0
            start += len(c.examples)
        return scores


QUICK_CONFIDENCE = 0.82
"""The static vectors' similarity from which their choice stands (`EmbeddingRouting`'s
`quick`). On the routing benchmark (docs/benchmarks.md) no request of 60 that belong to no
adapter reached 0.8 (their highest: 0.794), and 78% of requests that do belong to one were
above 0.82."""


QUICK_REJECT = 0.55
"""The static vectors' similarity under which no adapter is chosen without asking MiniLM
(`EmbeddingRouting`'s `quick_reject`). On the routing benchmark the lowest of 162 requests
that belong to an adapter was 0.599, and 21 of 60 requests that belong to none fell under
0.55 (docs/benchmarks.md, session 16). Of 167 more requests of an adapter's kind, checked
later, the lowest was 0.551, and those under 0.6 MiniLM too sends to the base model
(`benchmarks/routing_shortcuts.py`, session 17)."""
QUICK_REJECT_FROM = 0.5
"""The `min_confidence` `QUICK_REJECT` was calibrated with (the default): an operator who
lowers that bar to route more gets MiniLM's word on every request not quickly accepted."""


LEARNED_CONFIDENCE = 0.63
"""The learned static table's similarity from which its choice stands, where the plain static
vectors were not sure (`EmbeddingRouting`'s `second`): 0.005 above the highest request of no
adapter's kind (0.6151) among the routing benchmark's train requests past the profiles and its
first 20 unrelated ones, up to the next 0.01 (session 23 went up to the next 0.05: 0.65).
Checked on its 162 test requests and 79 unrelated requests written later (the highest of
those in the static vectors' band: 0.568): 109 of 162 of the right kind, 1 fewer than the
static vectors and the int8 graph without it, and no unrelated request more sent to an
adapter, as with 0.65; MiniLM asked about 36 of them instead of 38, and about 543 of the
router benchmark's 4,000 openings instead of 679 (`python -m benchmarks.learned_static bars`,
docs/benchmarks.md)."""
LEARNED_REJECT = 0.35
"""The learned table's similarity under which the base model answers without MiniLM: on the
same calibration requests, every request of an adapter's kind under it is one MiniLM's int8
graph sends to the base model too."""


class EmbeddingRouting:
    """The first user turn's similarity to each profile; the best candidate when its score
    reaches `min_confidence`.

    With `quick` (a cheap embedder: MiniLM's static token vectors), the cheap scores decide
    alone when their best reaches `quick_confidence`, a bar requests that belong to no
    adapter did not reach, or falls under `quick_reject`, a bar requests that belong to one
    did not fall under (the base model then); between the two `embedder` (MiniLM) decides.
    So most requests of an adapter's kind, and many of no adapter's kind, cost 0.06 ms
    instead of 1 to 12 ms, and the rest are told apart by MiniLM.

    With `second` as well (the learned static table, as cheap), the same again with its own
    bars between the quick stage and MiniLM: on the router benchmark's openings it decides
    three quarters of what the static vectors leave."""

    name = "embedding"

    def __init__(
        self,
        embedder: Embedder,
        min_confidence: float,
        *,
        quick: Embedder | None = None,
        quick_confidence: float = QUICK_CONFIDENCE,
        quick_reject: float = QUICK_REJECT,
        second: Embedder | None = None,
        second_confidence: float = LEARNED_CONFIDENCE,
        second_reject: float = LEARNED_REJECT,
        profiles: Embedder | None = None,
        alone: Callable[[], bool] | None = None,
    ) -> None:
        self.embedder = embedder
        self.min_confidence = min_confidence
        calibrated = min_confidence >= QUICK_REJECT_FROM  # the reject bars' own threshold
        self.profiles = profiles
        """Embeds the profiles for `embedder`'s scores where set (MiniLM itself for its int8
        graph: the queries approximate, the profiles exact)."""
        self._main = _Scorer(embedder, profiles, alone)
        """`alone`: whether the caller is the only one its event loop serves (a query is
        then embedded on the loop, see `Batched`)."""
        self._stages = [
            (_Scorer(stage), accept, reject if calibrated else 0.0, mode)
            for stage, accept, reject, mode in (
                (quick, quick_confidence, quick_reject, f"{self.name}:quick"),
                (second, second_confidence, second_reject, f"{self.name}:learned-table"),
            )
            if stage is not None
        ]
        """The cheap embedders before `embedder`, each with the bars between which it leaves
        the decision to the next."""

    @property
    def exact(self) -> Embedder:
        """MiniLM itself where the queries go through its int8 graph, else the embedder:
        what `learned` routing compares with (it embeds its examples with each query, so
        both sides alike, and the int8 graph on both sides let unrelated requests in)."""
        return self.profiles or self.embedder

    def warm(self) -> None:
        """Load the embedders (the static table is built on a first run: 10 s), so the
        first request does not wait for them. Blocking: call it off the event loop."""
        stages = [scorer.embedder for scorer, *_ in self._stages]
        for embedder in (self.embedder, self.profiles, *stages):
            if embedder is not None:
                embedder.embed(["warm up"])

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        if not candidates or not query.strip():
            return Decision(None, 0.0, self.name)
        for scorer, accept, reject, mode in self._stages:
            scores = await scorer.scores(query, candidates)
            best = max(candidates, key=lambda c: scores[c.name])
            # never below the operator's own bar, whichever is higher
            if scores[best.name] >= max(accept, self.min_confidence):
                return Decision(best, scores[best.name], mode, scores)
            if scores[best.name] < reject:
                return Decision(None, scores[best.name], mode, scores)
        scores = await self._main.scores(query, candidates)
        best = max(candidates, key=lambda c: scores[c.name])
        confidence = scores[best.name]
        chosen = best if confidence >= self.min_confidence else None
        return Decision(chosen, confidence, self.name, scores)


def embedding_routing(
    kind: str, min_confidence: float, alone: Callable[[], bool] | None = None
) -> EmbeddingRouting:
    """The embedding mode over the configured embedder: `minilm`, `minilm-int8`,
    `distilled`, `static`, `learned`, or `cascade` / `cascade-int8` / `cascade-distilled` /
    `cascade-learned` (static vectors where they are sure, MiniLM, its int8 graph, the
    distilled query encoder or the learned static table elsewhere), or
    `cascade-learned-int8` (static vectors, then the learned table, each where sure, then
    MiniLM's int8 graph). The int8 graphs embed queries only, MiniLM the profiles; the
    learned table embeds both (its vectors only approximate MiniLM's, and on the routing
    benchmark both sides alike did better)."""
    main, second = {
        "cascade": ("minilm", None),
        "cascade-int8": ("minilm-int8", None),
        "cascade-distilled": ("distilled", None),
        "cascade-learned": ("learned", None),
        "cascade-learned-int8": ("minilm-int8", "learned"),
    }.get(kind, (kind, None))
    return EmbeddingRouting(
        routing_embedder(main),
        min_confidence,
        quick=routing_embedder("static") if main != kind else None,
        second=routing_embedder(second) if second else None,
        profiles=routing_embedder("minilm") if main in ("minilm-int8", "distilled") else None,
        alone=alone,
    )


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXY"
CLASSIFY_SYSTEM = "You decide which skill a request needs. Answer with one letter only."


def classify_prompt(query: str, candidates: Sequence[Candidate]) -> str:
    options = [
        f"{LETTERS[i]}) {c.capability.replace('_', ' ')}"
        + (f": {c.examples[0]}" if c.examples else "")
        for i, c in enumerate(candidates)
    ]
    none = LETTERS[len(candidates)]
    options.append(f"{none}) none of these")
    return f"Request: {query}\n\nWhich skill does it need most?\n" + "\n".join(options)


class ClassifierRouting:
    """The base model as a classifier over capability labels (the paper's router): one
    completion token, the log-probabilities of the option letters among its top tokens,
    normalised over the options; confidence is the winner's share. "None of these" winning,
    or a confidence below the threshold, keeps the base model."""

    name = "classifier"

    def __init__(
        self, client: LLMClient, model: str, min_confidence: float, top_logprobs: int = 20
    ) -> None:
        self.client = client
        self.model = model
        self.min_confidence = min_confidence
        self.top_logprobs = top_logprobs

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        if not candidates or not query.strip():
            return Decision(None, 0.0, self.name)
        shown = list(candidates[: len(LETTERS) - 1])
        response = await self.client.chat(
            ChatRequest(
                model=self.model,
                messages=[
                    Message(role="system", content=CLASSIFY_SYSTEM),
                    Message(role="user", content=classify_prompt(query, shown)),
                ],
                temperature=0.0,
                max_tokens=1,
                logprobs=True,
                top_logprobs=self.top_logprobs,
            )
        )
        choice = response.choices[0] if response.choices else None
        first = choice.logprobs.content[0] if choice and choice.logprobs else None
        found: dict[str, float] = {}
        for top in first.top_logprobs if first else []:
            letter = top.token.strip().rstrip(")").upper()
            if len(letter) == 1 and letter in LETTERS and letter not in found:
                found[letter] = top.logprob
        letters = [LETTERS[i] for i in range(len(shown) + 1)]
        weights = {k: math.exp(found[k]) for k in letters if k in found}
        total = sum(weights.values())
        if not total:
            return Decision(None, 0.0, self.name)
        probs = {k: v / total for k, v in weights.items()}
        scores = {c.name: probs.get(LETTERS[i], 0.0) for i, c in enumerate(shown)}
        best = max(probs, key=lambda k: probs[k])
        confidence = probs[best]
        index = letters.index(best)
        chosen = shown[index] if index < len(shown) and confidence >= self.min_confidence else None
        return Decision(chosen, confidence, self.name, scores)


@dataclass(frozen=True)
class Example:
    """A train task's opening request and the configuration that did best on it (an adapter
    name; None: the base model), from a cycle's evaluation on train tasks."""

    text: str
    adapter: str | None


class LearnedRouting:
    """A router learned from evaluation results: the k train tasks most similar to the
    query (cosine by the embedder it is given) vote, weighted by similarity, for the
    configuration that won them. Confidence is the winner's share of the votes; the base
    model wins when it gets the most votes or the confidence is below the threshold."""

    name = "learned"

    def __init__(
        self,
        embedder: Embedder,
        examples: Sequence[Example],
        min_confidence: float,
        k: int = 5,
    ) -> None:
        self.embedder = embedder
        self.examples = list(examples)
        self.min_confidence = min_confidence
        self.k = k

    async def decide(self, query: str, candidates: Sequence[Candidate]) -> Decision:
        names = {c.name for c in candidates}
        usable = [e for e in self.examples if e.adapter is None or e.adapter in names]
        if not usable or not query.strip():
            return Decision(None, 0.0, self.name)
        vectors = await asyncio.to_thread(self.embedder.embed, [query] + [e.text for e in usable])
        q = vectors[0]
        ranked = sorted(
            ((max(0.0, cosine(q, v)), e) for v, e in zip(vectors[1:], usable, strict=True)),
            key=lambda pair: -pair[0],
        )[: self.k]
        votes: dict[str | None, float] = {}
        for similarity, example in ranked:
            votes[example.adapter] = votes.get(example.adapter, 0.0) + similarity
        total = sum(votes.values())
        if not total:
            return Decision(None, 0.0, self.name)
        best = max(votes, key=lambda label: (votes[label], label is None))
        confidence = votes[best] / total
        scores = {c.name: votes.get(c.name, 0.0) / total for c in candidates}
        chosen = next((c for c in candidates if c.name == best), None)
        if chosen is None or confidence < self.min_confidence:
            return Decision(None, confidence, self.name, scores)
        return Decision(chosen, confidence, self.name, scores)
