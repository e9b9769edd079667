"""A routing query's time when queries come back to back, and when the core idles between them
as it does in a router (a request at a time, a few milliseconds apart).

    python -m benchmarks.query_gaps --embedders minilm-int8 distilled --gaps 0 0.002 0.02

Each embedder (`shared.embeddings.routing_embedder`'s kinds) embeds the routing benchmark's
distinct requests one at a time (`--queries` of them, each made distinct by a number, so no
cache answers), sleeping `gap` seconds between two; the rounds go through the gaps twice, in
order, so a drift of the machine shows. Reported: p50 and p90 in milliseconds, tokenizer
included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.static_routing import requests
from shared.embeddings import routing_embedder


def timings(embedder: Any, texts: list[str], gap: float, tag: str) -> dict[str, float]:
    took = []
    for i, text in enumerate(texts):
        query = f"{text} {tag}{i}"  # never the same text twice: the embedder caches
        started = time.perf_counter()
        embedder.embed([query])
        took.append((time.perf_counter() - started) * 1000)
        if gap:
            time.sleep(gap)
    took.sort()
    return {"p50_ms": statistics.median(took), "p90_ms": took[int(len(took) * 0.9)]}


def main(args: argparse.Namespace) -> dict[str, Any]:
    texts = list(dict.fromkeys(text for _, _, text in requests()))[: args.queries]
    results: dict[str, Any] = {"queries": len(texts), "rounds": []}
    embedders = {kind: routing_embedder(kind) for kind in args.embedders}
    for embedder in embedders.values():  # loaded (or exported) first: not a query's time
        timings(embedder, texts[:20], 0.0, "warm")
    for round_ in (1, 2):
        for gap in args.gaps:
            for kind, embedder in embedders.items():
                row = {"round": round_, "embedder": kind, "gap_s": gap}
                row.update(timings(embedder, texts, gap, f"r{round_}g{gap}"))
                results["rounds"].append(row)
                print(json.dumps(row), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedders", nargs="+", default=["minilm-int8", "distilled"])
    parser.add_argument("--gaps", nargs="+", type=float, default=[0.0, 0.002, 0.02])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = main(args)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
