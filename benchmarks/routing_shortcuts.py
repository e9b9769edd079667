"""Ways the cascade could ask MiniLM less often, scored on the routing benchmark's requests
(`benchmarks/static_routing.py`) and on the router benchmark's openings
(`benchmarks/router_overhead.py`), against the cascade's own decisions.

    python -m benchmarks.routing_shortcuts --out docs/bench/routing_shortcuts.json

- `weights`: the static vectors' mean weighted by token frequency (smooth inverse frequency,
  a / (a + p), p from Zipf's law over the WordPiece vocabulary's order, which is by
  frequency from "the" on): whether requests of an adapter's kind and requests of none
  separate better than with the plain mean.
- `reuse`: a request whose static vector is within `tau` (cosine) of one MiniLM already
  decided takes that decision: how many reuse one, and how many of those MiniLM itself
  would have decided otherwise.
- `learned`: bars learned per adapter from MiniLM's own decisions in the cascade's middle
  band (an adapter's bar: just above the highest static score MiniLM overruled, once at
  least `n_min` agreeing decisions lie above it; the same for the base model below), with
  5% of the requests the bars decide still checked by MiniLM: MiniLM calls saved, and
  decisions that differ from MiniLM's.
The routing benchmark's requests are 428: its 162 test requests, the train requests past
each profile's first 16, and 99 requests of no adapter's kind (the benchmark's 60, and 39
written for this check before any of it ran; a 40th, the weather in Madrid, was dropped:
toolbox has a weather tool, and MiniLM rightly scored it 0.65).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import router_overhead
from benchmarks.static_routing import UNRELATED, UNRELATED_HELD_OUT, requests
from shared.embeddings import OnnxMiniLM, StaticMiniLM
from shared.routing.modes import QUICK_CONFIDENCE, QUICK_REJECT

THRESHOLD = 0.5
UNRELATED_LATER = (
    "How do I reset my router's wifi password?",
    "Can you explain the offside rule in football?",
    "What's a good gift for my dad who likes fishing?",
    "Why do onions make you cry?",
    "Help me write a toast for my sister's wedding.",
    "What is the difference between a virus and a bacterium?",
    "How many ounces are in a cup?",
    "Who invented the telephone?",
    "Draft a polite email declining a meeting invitation.",
    "What are some easy houseplants for beginners?",
    "Explain recursion with an example.",
    "How do I make cold brew coffee at home?",
    "What's the population of Canada?",
    "Tell me a bedtime story about a dragon.",
    "Which is bigger, a blue whale or a dinosaur?",
    "How do solar panels generate electricity?",
    "What should I name my fantasy football team?",
    "Give me a 20-minute bodyweight workout.",
    "What does HTTP stand for?",
    "ok",
    "hello there",
    "can you hear me?",
    "What's the meaning of life?",
    "Rewrite this more formally: gonna be late, sorry.",
    "What are the main causes of inflation?",
    "How do I get red wine out of a carpet?",
    "Is Pluto still a planet?",
    "What language is spoken in Brazil?",
    "Write a SQL query that counts users by country.",
    "How often should I water a cactus?",
    "Suggest a weekend itinerary for Rome.",
    "What's the chemical symbol for gold?",
    "How do I politely ask my neighbour to turn down music?",
    "Explain the rules of tennis scoring.",
    "What happened at the Battle of Hastings?",
    "How do I improve my credit score?",
    "Recommend a podcast about history.",
    "What is machine learning, in one paragraph?",
    "Tell me something interesting about honeybees.",
)
Embed = Callable[[Sequence[str]], Any]
Profiles = dict[str, list[str]]


def _routing_benchmark() -> tuple[Profiles, list[str], int]:
    """The 16 kinds' profiles, the requests, and how many of them (first) are of a kind."""
    rows = requests()
    kinds = sorted({k for k, _, _ in rows})
    trains = {k: [t for kk, s, t in rows if kk == k and s == "train"] for k in kinds}
    profiles = {k: v[:16] for k, v in trains.items() if len(v) >= 4}
    of_a_kind = [t for k, s, t in rows if s == "test" and k in profiles]
    of_a_kind += [t for k, v in trains.items() if k in profiles for t in v[16:]]
    unrelated = [*UNRELATED, *UNRELATED_HELD_OUT, *UNRELATED_LATER]
    return profiles, of_a_kind + unrelated, len(of_a_kind)


def _router_benchmark() -> tuple[Profiles, list[str]]:
    profiles = {
        "set_alarms": [
            "set alarms: Sets an alarm at the time the user asks for.",
            *router_overhead.ALARM_FAILURES,
        ],
        "convert_currency": [
            "convert currency: Converts money between currencies.",
            *router_overhead.CURRENCY_FAILURES,
        ],
    }
    return profiles, [router_overhead.opening(n) for n in range(0, 8000, 3)]


def _best(embed: Embed, profiles: Profiles, texts: Sequence[str]) -> tuple[list[str], Any]:
    """Each text's nearest profile (by its nearest example) and that similarity."""
    matrices = {k: np.asarray(embed(v)) for k, v in profiles.items()}
    queries = np.asarray(embed(list(texts)))
    scores = np.stack([(m @ queries.T).max(0) for m in matrices.values()])
    names = list(matrices)
    return [names[i] for i in scores.argmax(0)], scores.max(0)


def _decisions(embed: Embed, profiles: Profiles, texts: Sequence[str]) -> list[str | None]:
    chosen, best = _best(embed, profiles, texts)
    return [c if b >= THRESHOLD else None for c, b in zip(chosen, best, strict=True)]


def weighted(static: StaticMiniLM, a: float | None) -> Embed:
    """The static embedder with each token's vector weighted a / (a + p(token))."""
    table, words = static._load()
    ids = np.arange(table.shape[0])
    rank = np.where(ids >= 1996, ids - 1995, 1).astype(np.float64)  # characters: frequent
    p = (1.0 / (rank + 1)) / (1.0 / (rank + 1)).sum()
    weights = np.ones(len(ids)) if a is None else a / (a + p)

    def embed(texts: Sequence[str]) -> Any:
        out = []
        for ids in map(words.ids, texts):
            own = np.asarray(ids, dtype=np.int64)
            vector = (table[own] * weights[own][:, None]).sum(0)
            out.append(vector / (np.linalg.norm(vector) or 1.0))
        return np.asarray(out)

    return embed


def weights(static: StaticMiniLM) -> dict[str, object]:
    profiles, texts, of_a_kind = _routing_benchmark()
    truth = [k for k, s, _ in requests() if s == "test" and k in profiles]
    out: dict[str, object] = {}
    for a in (None, 1e-3, 1e-4, 1e-5):
        chosen, best = _best(weighted(static, a), profiles, texts)
        related, unrelated = best[:of_a_kind], best[of_a_kind:]
        bar = float(unrelated.max()) + 0.02
        out["mean" if a is None else f"a={a:g}"] = {
            "accuracy_on_test": float(
                np.mean([c == k for c, k in zip(chosen[: len(truth)], truth, strict=True)])
            ),
            "lowest_of_a_kind": float(related.min()),
            "highest_unrelated": float(unrelated.max()),
            "of_a_kind_over_highest_unrelated_plus_0.02": float(np.mean(related >= bar)),
            "unrelated_under_lowest_of_a_kind": float(np.mean(unrelated < related.min())),
        }
    return out


def bars(static: StaticMiniLM, minilm: OnnxMiniLM) -> dict[str, object]:
    """The cascade's bars against the requests: the highest static score of one of no
    adapter's kind, and the requests of an adapter's kind near `QUICK_REJECT` with MiniLM's
    score for them (under `THRESHOLD`, MiniLM sends them to the base model too)."""
    profiles, texts, of_a_kind = _routing_benchmark()
    _, quick = _best(static.embed, profiles, texts)
    _, exact = _best(minilm.embed, profiles, texts)
    near = sorted(
        (i for i in range(of_a_kind) if quick[i] < QUICK_REJECT + 0.05), key=lambda i: quick[i]
    )
    return {
        "quick_confidence": QUICK_CONFIDENCE,
        "highest_unrelated_static": float(quick[of_a_kind:].max()),
        "quick_reject": QUICK_REJECT,
        "of_a_kind_under_quick_reject_plus_0.05": [
            {"request": texts[i], "static": float(quick[i]), "minilm": float(exact[i])}
            for i in near
        ],
    }


def _middle(static_best: Any) -> list[bool]:
    """Requests the cascade sends to MiniLM today."""
    return [QUICK_REJECT <= b < QUICK_CONFIDENCE for b in static_best]


def reuse(static: StaticMiniLM, minilm: OnnxMiniLM, profiles: Profiles, texts: list[str]) -> Any:
    decided = _decisions(minilm.embed, profiles, texts)
    vectors = np.asarray(static.embed(texts))
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    out = {}
    for tau in (0.95, 0.97, 0.98):
        seen: list[int] = []
        reused = same = 0
        for i in order:
            if seen:
                similar = vectors[seen] @ vectors[i]
                j = int(similar.argmax())
                if similar[j] >= tau:
                    reused += 1
                    same += decided[seen[j]] == decided[i]
                    continue
            seen.append(i)
        out[f"tau={tau}"] = {"requests": len(texts), "reused": reused, "same_decision": same}
    return out


def learned(
    static: StaticMiniLM,
    minilm: OnnxMiniLM,
    profiles: Profiles,
    texts: list[str],
    n_min: int = 10,
    audit: float = 0.05,
    eps: float = 0.01,
    orders: int = 5,
) -> list[dict[str, int]]:
    quick, quick_best = _best(static.embed, profiles, texts)
    decided = _decisions(minilm.embed, profiles, texts)
    middle = _middle(quick_best)
    runs = []
    for seed in range(orders):
        rng = random.Random(seed)
        order = [i for i in range(len(texts)) if middle[i]]
        rng.shuffle(order)
        seen: dict[str, list[tuple[float, bool]]] = {}  # adapter -> (score, MiniLM agreed)
        low: list[tuple[float, bool]] = []  # (score, MiniLM chose the base model)
        calls = changed = 0
        for i in order:
            score, pick = float(quick_best[i]), quick[i]
            own = seen.setdefault(pick, [])
            overruled = [s for s, agreed in own if not agreed]
            bar = max(overruled) + eps if overruled else min((s for s, _ in own), default=9.0)
            above = sum(1 for s, agreed in own if agreed and s >= bar)
            floor = min((s for s, base in low if not base), default=9.0) - eps
            below = sum(1 for s, base in low if base and s < floor)
            guess: str | bool | None = False  # False: no bar decides
            if above >= n_min and score >= bar:
                guess = pick
            elif below >= n_min and score < floor:
                guess = None
            if guess is not False and rng.random() >= audit:
                changed += guess != decided[i]
                continue
            calls += 1
            own.append((score, decided[i] == pick))
            low.append((score, decided[i] is None))
        runs.append({"cascade_minilm_calls": len(order), "minilm_calls": calls, "changed": changed})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    static, minilm = StaticMiniLM(), OnnxMiniLM()
    routing_profiles, routing_texts, _ = _routing_benchmark()
    router_profiles, router_texts = _router_benchmark()
    out = {
        "bars": bars(static, minilm),
        "weights": weights(static),
        "reuse": {
            "routing_benchmark": reuse(static, minilm, routing_profiles, routing_texts),
            "router_benchmark_openings": reuse(static, minilm, router_profiles, router_texts),
        },
        "learned": {
            "routing_benchmark": learned(static, minilm, routing_profiles, routing_texts),
            "router_benchmark_openings": learned(
                static, minilm, router_profiles, router_texts, orders=2
            ),
        },
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
