"""Cheaper MiniLM encoders for routing, scored as `benchmarks/static_routing.py` scores the
routing embedders: the same 16 kinds and 162 test requests, the same unrelated requests.

    python -m benchmarks.encoder_variants --out docs/bench/encoder_variants.json

Each variant embeds both sides, the adapters' profiles and the requests, so only how well
it separates them matters, not how close its vectors are to all-MiniLM-L6-v2's:
- `int8`: the encoder's linear layers dynamically quantised to int8 (torch), all 6 layers;
- `layers N`: the first N of the 6 layers, mean-pooled as the full model is (fp32);
- `ONNX Runtime`: the full model exported to ONNX and run by ONNX Runtime (what routing
  uses where it is installed), fp32 or with its weights quantised to int8 (a scale per
  output channel, 7-bit weights), the int8 graph also embedding queries only against the
  fp32 graph's profiles, as routing's `cascade-int8` does.
Variants run one after another in one process, the full model between two int8 runs, so
the time of a variant is not its place in the order.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.static_routing import requests, score
from shared.embeddings import MiniLM, OnnxMiniLM

SHOWN = (
    "accuracy",
    "test_requests_over_threshold",
    "unrelated_over_threshold",
    "held_out_unrelated_over_threshold",
    "per_text_ms_batched",
    "one_query_ms",
)


class Variant(MiniLM):
    """MiniLM with its encoder cut to `layers` and/or its linear layers in int8."""

    def __init__(self, layers: int | None = None, int8: bool = False) -> None:
        super().__init__()
        self.layers = layers
        self.int8 = int8
        self._changed = False

    def _load(self) -> Any:
        model = super()._load()
        if self._changed:
            return model
        if self.layers is not None:
            encoder = model[0].auto_model.encoder
            encoder.layer = encoder.layer[: self.layers]
        if self.int8:
            import torch

            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, dtype=torch.qint8
            )
            self._model = model
        self._changed = True
        return model


VARIANTS: dict[str, tuple[type[MiniLM] | type[OnnxMiniLM], dict[str, Any]]] = {
    "int8": (Variant, {"int8": True}),
    "fp32 (as served)": (Variant, {}),
    "int8, again": (Variant, {"int8": True}),
    "layers 3": (Variant, {"layers": 3}),
    "layers 3, int8": (Variant, {"layers": 3, "int8": True}),
    "ONNX Runtime, 1 thread": (OnnxMiniLM, {"threads": 1}),
    "ONNX Runtime, 2 threads": (OnnxMiniLM, {"threads": 2}),
    "ONNX Runtime int8, 1 thread": (OnnxMiniLM, {"threads": 1, "int8": True}),
    "ONNX Runtime int8 queries, fp32 profiles": (OnnxMiniLM, {"threads": 1, "int8": True}),
}
PROFILES_BY = {"ONNX Runtime int8 queries, fp32 profiles": (OnnxMiniLM, {"threads": 1})}
"""Variants whose profiles another embedder embeds (routing's `minilm-int8` and
`cascade-int8`: its int8 graph embeds the queries, MiniLM itself the profiles)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", action="append", help="a variant's name (repeatable)")
    args = parser.parse_args()
    rows = requests()
    out = {}
    wanted = set(args.only or VARIANTS)
    for name, (kind, settings) in VARIANTS.items():
        if name not in wanted:
            continue
        by = PROFILES_BY.get(name)
        result = score(kind(**settings), rows, by[0](**by[1]) if by else None)
        out[name] = {k: result[k] for k in SHOWN}
        print(name, json.dumps(out[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
