"""The held-out check's cost at several lockstep batch sizes (`RETRACE_TRAIN_HELDOUT_BATCH`).

    python -m benchmarks.heldout_cpu --model qwen2.5-coder-0.5b --tasks 12 --samples 1 \
        --batch 8 24 --out docs/bench/heldout_cpu.json

The check the train worker runs after an adapter's last step (`services/train/heldout.py`):
the test tasks of a synthetic family's default spec, each (task, seed) played unhinted by the
adapter and by the base model, with the demo's sampling (at most `--max-turns` turns of
`--max-new-tokens` tokens). The adapter is fresh (LoRA B = 0), so both sides generate what
the base model does; the numbers are the check's wall time, not its result. Every batch size
plays the same (task, seed) pairs; a row's sampling seed depends on its place in its lockstep
group, so the sampled replies (and their lengths) differ between batch sizes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from services.train.grpo import GRPOSettings, lora_policy
from services.train.heldout import HeldoutSettings, heldout
from shared.envs.synthetic import SyntheticEnvironment, family_spec
from shared.serving.model_files import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--family", default="set_alarm_at_time")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    s = GRPOSettings(max_new_tokens=args.max_new_tokens, max_turns=args.max_turns)
    policy = lora_policy(str(resolve_model(args.model)), s, device="cpu")
    env = SyntheticEnvironment(family_spec(args.family, f"bench_{args.family}"))
    rows = []
    for batch in args.batch:
        h = HeldoutSettings(tasks=args.tasks, samples=args.samples, batch=batch)
        started = time.perf_counter()
        result = heldout(policy, env, s, h)
        row = {
            "batch": batch,
            "episodes": result["episodes"] * 2,
            "wall_s": round(time.perf_counter() - started, 1),
            "base_mean": result["base_mean"],
            "adapter_mean": result["adapter_mean"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps({"model": args.model, "family": args.family, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
