"""Where a CPU's generation time goes: one prefill and decode steps of the raw model, batched.

    python -m benchmarks.forward_cpu --model qwen2.5-coder-0.5b --prompt 500 --batch 1 4 8 16

For each batch size: a forward pass over `--prompt` random tokens in every row (the prefill an
engine pays for each row whose prompt it has not cached), then `--steps` greedy decode steps
on that cache. No engine, no sampling code, no HTTP: what the weights and torch cost here,
to compare with the engines' tokens/s (`benchmarks/engines.py`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from shared.serving.model_files import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompt", type=int, default=500, help="prompt tokens per row")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
    model.eval()
    rows = []
    for batch in args.batch:
        ids = torch.randint(
            0, 30_000, (batch, args.prompt), generator=torch.Generator().manual_seed(0)
        )
        with torch.no_grad():
            started = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            prefill = time.perf_counter() - started
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            started = time.perf_counter()
            for _ in range(args.steps):
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            step = (time.perf_counter() - started) / args.steps
        row = {
            "batch": batch,
            "prefill_s": round(prefill, 2),
            "prefill_tok_s": round(batch * args.prompt / prefill, 1),
            "decode_step_ms": round(step * 1000, 1),
            "decode_tok_s": round(batch / step, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"model": args.model, "prompt": args.prompt, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
