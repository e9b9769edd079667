"""Routing's MiniLM graph with ONNX Runtime's BERT fusions (`shared.embeddings._fuse`)
against the graph as PyTorch exports it, or (`--baseline skip-layer-norm`) against the fused
graph before session 25, its residuals' add and norm fused into `SkipLayerNormalization`;
fp32 and int8, a query at a time.

    python -m benchmarks.fused_graph --gaps 0 0.005 --out docs/bench/fused_graph.json
    python -m benchmarks.fused_graph --baseline skip-layer-norm --out docs/bench/sln.json

Both graphs are made afresh in `--dir` (the int8 twins by `shared.embeddings._quantized`, as
routing makes them) and run as routing runs them. Each query goes to both graphs of a kind,
in turn, the order swapped every query (so a drift of the machine's speed weighs on both
alike), `gap` seconds of sleep after each; the texts are the routing benchmark's distinct
requests and the router benchmark's openings. Reported: p50 and p90 in milliseconds, the
Rust tokenizer included (routing now reads the ids from memory, `shared.wordpiece`), the
fused graph's p50 over the baseline's, and each graph's mean and lowest cosine to MiniLM's
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


def _session(path: Path, unfused: list[str]) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # as routing runs it
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=unfused
    )


def _graphs(where: Path, baseline: str) -> dict[str, tuple[Path, Path]]:
    """kind -> (the baseline, fused)."""
    encoder = embeddings.MiniLM()._load()[0].auto_model
    before, fused = where / f"{baseline}.onnx", where / "fused.onnx"
    embeddings._export_onnx(encoder, fused)
    if baseline == "exported":
        embeddings._export_onnx(encoder, before, fuse=False)
    else:  # session 24's `_fuse`: ONNX Runtime's BERT fusions, every one of them
        from onnxruntime.transformers.optimizer import optimize_model

        plain = where / "plain.onnx"
        previous = encoder.config._attn_implementation
        encoder.set_attn_implementation("eager")  # the pattern the fusions know, as routing
        try:
            embeddings._export_onnx(encoder, plain, fuse=False)
        finally:
            encoder.set_attn_implementation(previous)
        model = optimize_model(
            str(plain),
            model_type="bert",
            num_heads=encoder.config.num_attention_heads,
            hidden_size=encoder.config.hidden_size,
        )
        counts = model.get_fused_operator_statistics()
        layers = encoder.config.num_hidden_layers
        if counts.get("Attention") != layers or counts.get("SkipLayerNormalization") != 2 * layers:
            raise SystemExit(f"the baseline is not session 24's graph: {counts}")
        model.save_model_to_file(str(before))
    return {
        "fp32": (before, fused),
        "int8": (embeddings._quantized(before), embeddings._quantized(fused)),
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
        graphs = _graphs(Path(where), args.baseline)
        for kind, (before, fused) in graphs.items():
            # the baseline as it was run: ONNX Runtime's own fusions all on
            sessions = [_session(before, []), _session(fused, embeddings.SESSION_UNFUSED)]
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
                    for g, graph in enumerate((args.baseline, "fused")):
                        times = sorted(took[g])
                        row[graph] = {
                            "p50_ms": statistics.median(times),
                            "p90_ms": times[int(len(times) * 0.9)],
                            "cosine_to_minilm_mean": statistics.fmean(cosines[g]),
                            "cosine_to_minilm_min": min(cosines[g]),
                        }
                    row[f"fused_over_{args.baseline}_p50"] = (
                        row["fused"]["p50_ms"] / row[args.baseline]["p50_ms"]
                    )
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gaps", nargs="+", type=float, default=[0.0, 0.005])
    parser.add_argument(
        "--baseline",
        choices=("exported", "skip-layer-norm"),
        default="exported",
        help="the graph the fused one is measured against",
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="where the graphs are made")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = main(args)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
