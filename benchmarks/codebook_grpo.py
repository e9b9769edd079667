"""What the promotion e2e test relies on: SmolLM2's success rate on the planted codebook target
(tests/support/codebook_env.py) at a few temperatures, and how far GRPO moves it.

    python -m benchmarks.codebook_grpo --temperatures 1.0 0.7 --steps 12 --lr 5e-4 \
        --out docs/bench/codebook_grpo.json

Each temperature: `--groups` train tasks x `--group-size` samples with a fresh adapter (the
base model). Then GRPO trains on the target itself at the last temperature (one group a step,
train tasks in id order) and the first `--test-tasks` test tasks x 2 seeds are played before
and after, with the same sampling seed. The e2e test trains on a derived environment graded by
`use_tools_when_needed` instead; this measures the model and the task, not the pipeline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from services.train.grpo import (
    GRPOSettings,
    lora_policy,
    optimizer_for,
    policy_step,
    rollout_episodes,
    rollout_group,
)
from shared.serving.model_files import resolve_model
from tests.support.codebook_env import CodebookEnvironment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--test-tasks", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env = CodebookEnvironment()
    train = [t for t in env.tasks() if t.split == "train"]
    test = [t for t in env.tasks() if t.split == "test"][: args.test_tasks]
    out: dict[str, object] = {"model": args.model, "args": vars(args) | {"out": str(args.out)}}
    base: dict[str, float] = {}
    s = GRPOSettings()
    policy = None
    for temperature in args.temperatures:
        s = GRPOSettings(
            group_size=args.group_size,
            max_new_tokens=args.max_new_tokens,
            max_turns=2,
            temperature=temperature,
            learning_rate=args.lr,
        )
        policy = lora_policy(str(resolve_model(args.model)), s)
        samples = [
            r.reward >= 1.0
            for i, task in enumerate(train[: args.groups])
            for r in rollout_group(policy, env, task, list(range(s.group_size)), s, sample_seed=i)
        ]
        base[str(temperature)] = statistics.mean(samples)
        print(f"temperature {temperature}: base success {base[str(temperature)]:.3f}", flush=True)
    out["base_success_by_temperature"] = base
    assert policy is not None

    def success() -> float:
        pairs = [(t, 100 + k) for t in test for k in range(2)]
        played = rollout_episodes(
            policy, env, pairs, s, hinted=[False] * len(pairs), sample_seed=99
        )
        return statistics.mean(r.reward >= 1.0 for r in played)

    started = time.perf_counter()
    before = success()
    optimizer = optimizer_for(policy, s)
    curve = []
    for step in range(args.steps):
        seeds = list(range(step * s.group_size, (step + 1) * s.group_size))
        group = rollout_group(policy, env, train[step % len(train)], seeds, s, sample_seed=step)
        policy_step(policy, optimizer, [group], s)
        curve.append(statistics.mean(r.reward for r in group))
        print(f"step {step}: group mean reward {curve[-1]:.3f}", flush=True)
    after = success()
    out |= {
        "test_success_before": before,
        "test_success_after": after,
        "group_mean_reward": curve,
        "train_and_test_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
