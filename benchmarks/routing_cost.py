"""What routing a new conversation costs in the embedding mode, piece by piece.

    python -m benchmarks.routing_cost --queries 50

Two production adapters with 32 profile examples each (embedded once, then cached, as the
router keeps them), then: one `EmbeddingRouting.decide` per query, sequentially; MiniLM on
one text; MiniLM on 16 texts at once; and the 64 cosines the router computed in Python
before it kept each profile as a matrix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from shared.embeddings import cosine, default_embedder
from shared.routing.modes import Candidate, EmbeddingRouting


async def main(queries: int) -> dict[str, float]:
    embedder = default_embedder()
    alarms = tuple(f"Set an alarm for {h}:30 labelled task {h}" for h in range(32))
    money = tuple(f"Convert {h * 10} dollars into euros please {h}" for h in range(32))
    candidates = [
        Candidate(uuid.uuid4(), "bot--alarms", "set_alarms", alarms),
        Candidate(uuid.uuid4(), "bot--money", "convert_currency", money),
    ]
    router = EmbeddingRouting(embedder, 0.5)
    await router.decide("warm up", candidates)
    out: dict[str, float] = {}
    started = time.perf_counter()
    for i in range(queries):
        await router.decide(f"Wake me at {i} tomorrow please", candidates)
    out["decide_ms"] = (time.perf_counter() - started) / queries * 1000
    started = time.perf_counter()
    for i in range(queries):
        embedder.embed([f"Another query number {i} about money"])
    out["embed_one_ms"] = (time.perf_counter() - started) / queries * 1000
    batches = max(1, queries // 5)
    started = time.perf_counter()
    for i in range(batches):
        embedder.embed([f"Batch query {i} {j} about alarms" for j in range(16)])
    out["embed_16_ms"] = (time.perf_counter() - started) / batches * 1000
    query, vectors = embedder.embed(["x"])[0], embedder.embed(list(alarms + money))
    started = time.perf_counter()
    for _ in range(queries):
        max(cosine(query, v) for v in vectors)
    out["python_cosines_64_ms"] = (time.perf_counter() - started) / queries * 1000
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=50)
    print(json.dumps(asyncio.run(main(parser.parse_args().queries)), indent=2))
