"""Routing quality and cost of the two routing embedders, MiniLM and its static token vectors.

    python -m benchmarks.static_routing --out docs/bench/static_routing.json

Every task kind of toolbox, helpdesk and hotel-desk with at least 4 train tasks stands for an
adapter: its profile is the opening requests of its first 16 train tasks. Each test task's
opening request is routed to the profile with the most similar example (the embedding mode's
rule); a request routed to its own kind counts as right. 16 kinds, 162 test requests: a hard
test, since several kinds of one environment read alike (toolbox's single_tool and
multi_step), but the same for both embedders.

Routing also decides whether a request belongs to any adapter: below the confidence
threshold (`RETRACE_ROUTER_MIN_CONFIDENCE`, 0.5) the base model answers. So each embedder's
best similarity is also measured for the test requests (each has an adapter of its kind) and
for 20 requests no adapter was trained for, with the share of each above the threshold.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from shared.embeddings import Embedder, MiniLM, StaticMiniLM
from shared.envs.registry import get_environment
from shared.routing.modes import QUICK_CONFIDENCE, QUICK_REJECT

ENVIRONMENTS = ("toolbox", "helpdesk", "hotel-desk")
THRESHOLD = 0.5
UNRELATED = (
    "Who painted the Mona Lisa?",
    "What is the capital of Australia?",
    "Tell me a joke about cats.",
    "How do I bake sourdough bread?",
    "Explain quantum entanglement simply.",
    "hi",
    "What's 17 times 23?",
    "Write a haiku about autumn.",
    "Translate 'good morning' into Spanish.",
    "Summarise the plot of Hamlet in two sentences.",
    "Which planets have rings?",
    "Recommend a good science fiction novel.",
    "How many legs does a spider have?",
    "What causes the seasons on Earth?",
    "Give me three tips for a job interview.",
    "Is a tomato a fruit or a vegetable?",
    "Why is the sky blue?",
    "Write a limerick about a programmer.",
    "What year did the Berlin Wall fall?",
    "How do vaccines work?",
)


UNRELATED_HELD_OUT = (
    "Can you help me write a cover letter for a nursing job?",
    "What's the difference between TCP and UDP?",
    "I need a recipe for vegan lasagna.",
    "How long should I boil an egg for a runny yolk?",
    "Explain how a bill becomes a law in the US.",
    "What are the symptoms of dehydration?",
    "Suggest a name for my new puppy.",
    "How do I center a div in CSS?",
    "What's a good stretching routine after running?",
    "Who won the 2018 football World Cup?",
    "Write a short poem about the sea.",
    "What is the boiling point of water at high altitude?",
    "Can you explain what a mortgage is?",
    "Give me a fun fact about octopuses.",
    "How many calories are in a banana?",
    "What does 'carpe diem' mean?",
    "Help me plan a birthday party for a ten-year-old.",
    "Why do cats purr?",
    "What is the tallest mountain in Africa?",
    "How do I change a flat tyre on a bicycle?",
    "Tell me about the history of the Roman Empire.",
    "What's the best way to learn a new language?",
    "Can you proofread this sentence: their going to the park tomorow.",
    "How does compound interest work?",
    "List three famous paintings by Van Gogh.",
    "What should I pack for a week of camping?",
    "Is it safe to eat raw cookie dough?",
    "Explain photosynthesis to a child.",
    "How do I write a for loop in Python?",
    "What's the plot of The Great Gatsby?",
    "good evening!",
    "thanks, that's all",
    "Are you a robot?",
    "What's your favourite colour?",
    "Recommend a board game for four players.",
    "How far is the Moon from the Earth?",
    "What is the GDP of Japan?",
    "How do noise-cancelling headphones work?",
    "Describe the rules of chess briefly.",
    "What's the square root of 144?",
)
"""Written after the cascade's bar (0.82) was chosen on `UNRELATED` and the test requests:
the check that no request of no adapter's kind reaches it."""


SHOWN = (
    "accuracy",
    "test_requests_over_threshold",
    "unrelated_over_threshold",
    "held_out_unrelated_over_threshold",
    "test_best_similarity_median",
    "unrelated_best_similarity_median",
    "one_query_ms",
)
"""What a comparison of embedders shows of each one's `score`."""


def requests() -> list[tuple[str, str, str]]:
    """(kind, split, opening request) of every task of the environments."""
    rows: list[tuple[str, str, str]] = []
    for name in ENVIRONMENTS:
        env = get_environment(name)
        for task in env.tasks():
            episode = env.reset(task, 0)
            text = next((m.content for m in episode.messages if m.role == "user"), None)
            if text:
                rows.append((f"{name}/{task.kind}", task.split, text))
    return rows


def score(
    embedder: Embedder, rows: list[tuple[str, str, str]], by: Embedder | None = None
) -> dict[str, object]:
    """`embedder`'s routing: the right kind, the similarities over the threshold, its time;
    the profiles embedded `by` another embedder where given (routing's int8 graph embeds
    queries against MiniLM's own vectors of the profiles)."""
    kinds = sorted({k for k, _, _ in rows})
    profiles = {k: [t for kk, s, t in rows if kk == k and s == "train"][:16] for k in kinds}
    profiles = {k: v for k, v in profiles.items() if len(v) >= 4}
    queries = [(k, t) for k, s, t in rows if s == "test" and k in profiles]
    by = by or embedder
    embedder.embed(["warm up"])
    by.embed(["warm up"])
    started = time.perf_counter()
    matrices = {k: np.asarray(by.embed(v)) for k, v in profiles.items()}
    vectors = np.asarray(embedder.embed([t for _, t in queries]))
    texts = len(queries) + sum(len(v) for v in profiles.values())
    per_text_ms = (time.perf_counter() - started) / texts * 1000
    chosen = [max(matrices, key=lambda k: float((matrices[k] @ q).max())) for q in vectors]
    right = sum(c == k for c, (k, _) in zip(chosen, queries, strict=True))
    best = [max(float((m @ q).max()) for m in matrices.values()) for q in vectors]
    off = [
        max(float((m @ q).max()) for m in matrices.values())
        for q in np.asarray(embedder.embed(list(UNRELATED)))
    ]
    held_out = [
        max(float((m @ q).max()) for m in matrices.values())
        for q in np.asarray(embedder.embed(list(UNRELATED_HELD_OUT)))
    ]
    started = time.perf_counter()
    for i in range(200):
        embedder.embed([f"Wake me at {i} tomorrow please"])
    return {
        "kinds": len(profiles),
        "queries": len(queries),
        "accuracy": right / len(queries),
        "test_requests_over_threshold": sum(b >= THRESHOLD for b in best) / len(best),
        "unrelated_over_threshold": sum(b >= THRESHOLD for b in off) / len(off),
        "held_out_unrelated_over_threshold": sum(b >= THRESHOLD for b in held_out) / len(held_out),
        "test_best_similarity_median": float(np.median(best)),
        "unrelated_best_similarity_median": float(np.median(off)),
        "per_text_ms_batched": per_text_ms,
        "one_query_ms": (time.perf_counter() - started) / 200 * 1000,
        "chosen": chosen,
        "best": best,
        "truth": [k for k, _ in queries],
        "unrelated_best": off + held_out,
    }


def cascade(minilm: dict[str, Any], static: dict[str, Any]) -> dict[str, object]:
    """The `cascade` embedder's decisions, from the two embedders' own: static's choice
    where its best similarity reaches `QUICK_CONFIDENCE`, the base model where it falls under
    `QUICK_REJECT`, MiniLM's (with the threshold) between."""
    queries = static["truth"]
    quick = [b >= QUICK_CONFIDENCE for b in static["best"]]
    rejected = [b < QUICK_REJECT for b in static["best"]]
    picks = [
        sc if q else None if r else (mc if mb >= THRESHOLD else None)
        for q, r, sc, mc, mb in zip(
            quick, rejected, static["chosen"], minilm["chosen"], minilm["best"], strict=True
        )
    ]
    wrong_off = [
        sb >= QUICK_CONFIDENCE or (sb >= QUICK_REJECT and mb >= THRESHOLD)
        for sb, mb in zip(static["unrelated_best"], minilm["unrelated_best"], strict=True)
    ]
    return {
        "quick_confidence": QUICK_CONFIDENCE,
        "quick_reject": QUICK_REJECT,
        "accuracy": sum(p == k for p, k in zip(picks, queries, strict=True)) / len(picks),
        "test_requests_decided_by_static": sum(quick) / len(quick),
        "test_requests_rejected_by_static": sum(rejected) / len(rejected),
        "unrelated_rejected_by_static": sum(b < QUICK_REJECT for b in static["unrelated_best"]),
        "unrelated_sent_to_an_adapter": f"{sum(wrong_off)}/{len(wrong_off)}",
        "unrelated_over_quick_confidence_under_static": sum(
            b >= QUICK_CONFIDENCE for b in static["unrelated_best"]
        ),
        "highest_unrelated_static_similarity": max(static["unrelated_best"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = requests()
    started = time.perf_counter()
    static = StaticMiniLM()
    static.embed(["load"])
    load_s = time.perf_counter() - started
    results = {"minilm": score(MiniLM(), rows), "static": score(static, rows)}
    agree = [
        a == b
        for a, b in zip(results["minilm"]["chosen"], results["static"]["chosen"], strict=True)  # type: ignore[call-overload]
    ]
    out = {
        **{
            name: {
                k: v for k, v in r.items() if k not in ("chosen", "best", "truth", "unrelated_best")
            }
            for name, r in results.items()
        },
        "cascade": cascade(results["minilm"], results["static"]),
        "agreement": sum(agree) / len(agree),
        "static_load_s": load_s,
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
