"""GRPO with the base model: group rollouts and policy steps on the synthetic families.

    python -m benchmarks.grpo_cpu --families all --tasks 2 --group 8 --out docs/bench/grpo_cpu.json

On a GPU worker, sampling through vLLM as `RETRACE_TRAIN_GENERATION=endpoint` does (vLLM must
serve the same weights: the first sync checks it):

    python -m benchmarks.grpo_cpu --device cuda --endpoint http://127.0.0.1:8000/v1 \
        --model /models/smollm2 --out docs/bench/grpo_gpu.json

For each family's default spec, `--tasks` train tasks: one group of `--group` episodes at
temperature 1 (lockstep batched generation, exactly what the train worker does), then one
policy step on it. Reports wall time per group and per step (and per adapter sync with
`--endpoint`), completion tokens, the tool calls the base model made, the group's rewards
(variance is what GRPO learns from), and peak memory (RSS; CUDA allocations on a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from services.train.grpo import (
    GRPOSettings,
    lora_policy,
    optimizer_for,
    policy_step,
    rollout_group,
)
from services.train.sampling import EndpointSampler, LocalSampler, Sampler
from shared.envs.synthetic import SyntheticEnvironment, family_spec
from shared.envs.synthetic.families import FAMILIES
from shared.llm.client import LLMClient
from shared.serving.model_files import resolve_model


def _peak_rss_mib() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _endpoint_sampler(url: str, end_id: int, directory: Path) -> EndpointSampler:
    """The train worker's endpoint sampler, its HTTP calls on a loop of their own."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return EndpointSampler(LLMClient(url), loop, directory, "bench-grpo", end_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="all")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--endpoint", help="sample through this OpenAI-compatible endpoint")
    parser.add_argument("--hint-share", type=float, default=0.0, help="hinted share of a group")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    families = list(FAMILIES) if args.families == "all" else args.families.split(",")
    s = GRPOSettings(
        group_size=args.group,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        learning_rate=1e-5,
        hint_share=args.hint_share,
    )
    policy = lora_policy(str(resolve_model(args.model)), s, device=args.device)
    optimizer = optimizer_for(policy, s)
    loaded_mib = _peak_rss_mib()
    live = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    sampler: Sampler = (
        _endpoint_sampler(args.endpoint, policy.end_id, live)
        if args.endpoint
        else LocalSampler(policy)
    )
    sampler.sync(policy, 0)
    steps = 0
    rows = []
    for family in families:
        env = SyntheticEnvironment(family_spec(family, f"bench_{family}"))
        tasks = [t for t in env.tasks() if t.split == "train"][: args.tasks]
        for index, task in enumerate(tasks):
            started = time.perf_counter()
            group = rollout_group(
                policy, env, task, list(range(args.group)), s, sample_seed=index, sampler=sampler
            )
            rollout_s = time.perf_counter() - started
            started = time.perf_counter()
            stats = policy_step(policy, optimizer, [group], s)
            step_s = time.perf_counter() - started
            steps += 1
            started = time.perf_counter()
            sampler.sync(policy, steps)
            sync_s = time.perf_counter() - started
            calls = sum(
                1
                for r in group
                for m in r.messages
                if m.get("role") == "assistant" and m.get("tool_calls")
            )
            row = {
                "family": family,
                "task": task.id,
                "rewards": [round(r.reward, 3) for r in group],
                "reward_std": round(statistics.pstdev(r.reward for r in group), 4),
                "tool_calls": calls,
                "completion_tokens": sum(len(t.completion_ids) for r in group for t in r.turns),
                "prompt_tokens": sum(len(t.loss_prompt_ids) for r in group for t in r.turns),
                "hinted_reward": stats.hinted_reward,
                "unhinted_reward": stats.unhinted_reward,
                "rollout_s": round(rollout_s, 2),
                "step_s": round(step_s, 2),
                "sync_s": round(sync_s, 3),
                "group_used": stats.used,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    sampler.close()
    if isinstance(sampler, EndpointSampler):
        asyncio.run_coroutine_threadsafe(sampler.client.close(), sampler.loop).result()
    summary = {
        "device": args.device,
        "generation": "endpoint" if args.endpoint else "local",
        "endpoint_drift": getattr(sampler, "drift", None),
        "groups": len(rows),
        "episodes": len(rows) * args.group,
        "tool_calls": sum(r["tool_calls"] for r in rows),
        "groups_with_variance": sum(1 for r in rows if r["reward_std"] > 0),
        "rollout_s_mean": round(statistics.fmean(r["rollout_s"] for r in rows), 2),
        "step_s_mean": round(statistics.fmean(r["step_s"] for r in rows), 2),
        "sync_s_mean": round(statistics.fmean(r["sync_s"] for r in rows), 3),
        "tokens_per_s": round(
            sum(r["completion_tokens"] for r in rows) / sum(r["rollout_s"] for r in rows), 1
        ),
        "backward_tokens_per_s": round(
            sum(r["completion_tokens"] + r["prompt_tokens"] for r in rows)
            / sum(r["step_s"] for r in rows),
            1,
        ),
        "peak_rss_after_load_mib": loaded_mib,
        "peak_rss_mib": _peak_rss_mib(),
        "peak_cuda_mib": (
            torch.cuda.max_memory_allocated() // 2**20 if torch.cuda.is_available() else None
        ),
    }
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(
            json.dumps(
                {"settings": vars(args) | {"out": str(args.out)}, "rows": rows, "summary": summary},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
