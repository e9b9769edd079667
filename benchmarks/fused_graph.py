"""Routing's MiniLM graph as PyTorch exports it against the one with ONNX Runtime's BERT
fusions (`shared.embeddings._fuse`), fp32 and int8, a query at a time.

    python -m benchmarks.fused_graph --gaps 0 0.005 --out docs/bench/fused_graph.json

Both graphs are made afresh in `--dir` (the int8 twins by `shared.embeddings._quantized`, as
routing makes them). Each query goes to both graphs of a kind, in turn, the order swapped
every query (so a drift of the machine's speed weighs on both alike), `gap` seconds of sleep
after each; the texts are the routing benchmark's distinct requests and the router
benchmark's openings. Reported: p50 and p90 in milliseconds, tokenizer included, the fused
graph's p50 over the exported one's, and each graph's mean and lowest cosine to MiniLM's
own vectors (PyTorch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.router_overhead import opening
from benchmarks.static_routing import requests
from shared import embeddings


def _session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # as routing runs it
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _graphs(where: Path) -> dict[str, tuple[Path, Path]]:
    """kind -> (exported, fused)."""
    encoder = embeddings.MiniLM()._load()[0].auto_model
    exported, fused = where / "exported.onnx", where / "fused.onnx"
    embeddings._export_onnx(encoder, exported, fuse=False)
    embeddings._export_onnx(encoder, fused)
    return {
        "fp32": (exported, fused),
        "int8": (embeddings._quantized(exported), embeddings._quantized(fused)),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    tokenizer = embeddings._tokenizer()
    texts = {
        "routing benchmark": list(dict.fromkeys(t for _, _, t in requests()))[: args.queries],
        "router benchmark openings": [opening(i) for i in range(args.queries)],
    }
    reference = {
        name: np.asarray(embeddings.MiniLM(cache_size=0).embed(own), dtype=np.float32)
        for name, own in texts.items()
    }

    def query(session: Any, text: str) -> tuple[float, Any]:
        started = time.perf_counter()
        [encoded] = tokenizer.encode_batch([text])
        ids = np.asarray([encoded.ids], dtype=np.int64)
        mask = np.asarray([encoded.attention_mask], dtype=np.int64)
        [vectors] = session.run(None, {"input_ids": ids, "attention_mask": mask})
        return (time.perf_counter() - started) * 1000, vectors[0]

    results: dict[str, Any] = {"queries": args.queries, "rows": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        graphs = _graphs(Path(where))
        for kind, paths in graphs.items():
            sessions = [_session(p) for p in paths]
            for name, own in texts.items():
                for session in sessions:  # loaded and warm: not a query's time
                    for text in own[:20]:
                        query(session, f"{text} warm")
                for gap in args.gaps:
                    took: list[list[float]] = [[], []]
                    cosines: list[list[float]] = [[], []]
                    for i, text in enumerate(own):
                        for g in (0, 1) if i % 2 == 0 else (1, 0):
                            ms, vector = query(sessions[g], text)
                            took[g].append(ms)
                            cosines[g].append(float(vector @ reference[name][i]))
                            if gap:
                                time.sleep(gap)
                    row: dict[str, Any] = {"kind": kind, "texts": name, "gap_s": gap}
                    for g, graph in enumerate(("exported", "fused")):
                        times = sorted(took[g])
                        row[graph] = {
                            "p50_ms": statistics.median(times),
                            "p90_ms": times[int(len(times) * 0.9)],
                            "cosine_to_minilm_mean": statistics.fmean(cosines[g]),
                            "cosine_to_minilm_min": min(cosines[g]),
                        }
                    row["fused_over_exported_p50"] = (
                        row["fused"]["p50_ms"] / row["exported"]["p50_ms"]
                    )
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps", nargs="+", type=float, default=[0.0, 0.005])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="where the graphs are made")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = main(args)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
