"""One decode step of serve-model's batch decoder over long conversations, and their prefill.

    python -m benchmarks.batch_decode --rows 24 --system 3000 --task 60 --steps 12
    python -m benchmarks.batch_decode --batch-module /tmp/batch_before.py   # another version

Rows share a `--system`-token system turn (toolbox's is about 3,000 tokens with its tools) and
each adds `--task` tokens of its own; the first row prefills the system turn, the others start
from it (the key/value store). Then `--steps` decode steps of all rows. `--batch-module` loads
`Batch` from a file instead (e.g. `git show <rev>:shared/serving/batch.py > /tmp/b.py`) to
compare versions on one machine. Random token ids: the cost does not depend on the text.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import torch

from shared.serving.batch import Batch
from shared.serving.kv_store import KVStore
from shared.serving.model_files import DEFAULT_CACHE, resolve_model


def batch_class(path: Path | None) -> Any:
    if path is None:
        return Batch
    spec = importlib.util.spec_from_file_location("batch_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--system", type=int, default=3000)
    parser.add_argument("--task", type=int, default=60)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-module", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    from transformers import AutoModelForCausalLM

    path = resolve_model(args.model, DEFAULT_CACHE)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    system = torch.randint(0, vocab, (args.system,), generator=g).tolist()
    prompts = [
        system + torch.randint(0, vocab, (args.task,), generator=g).tolist()
        for _ in range(args.rows)
    ]
    started = time.perf_counter()
    batch = batch_class(args.batch_module)(model, 0, KVStore())
    batch.add(prompts)
    prefilled = time.perf_counter()
    for _ in range(args.steps):
        batch.step([5] * args.rows)
    done = time.perf_counter()
    result = {
        "model": args.model,
        "batch_module": str(args.batch_module or "shared/serving/batch.py"),
        "rows": args.rows,
        "context": args.system + args.task,
        "prefill_s": round(prefilled - started, 2),
        "prefilled_tokens": batch.prefilled,
        "prefill_tokens_per_s": round(batch.prefilled / (prefilled - started), 1),
        "step_s": round((done - prefilled) / args.steps, 3),
        "decode_tokens_per_s": round(args.steps * args.rows / (done - prefilled), 2),
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
