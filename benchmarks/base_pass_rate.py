"""The base model's pass rate and mean reward on the built-in environments, greedy and sampled.

    python -m benchmarks.base_pass_rate --tasks 24 --trials 3 --out docs/bench/base_pass_rate.json

Starts `retrace serve-model` (SmolLM2 on CPU) unless --url is given, and runs episodes with
the same runner the rollout service uses. Tasks are a fixed sample spread over kinds (sorted
ids, round-robin), the same on every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.model_server import spawn, wait_up
from shared.envs.registry import get_environment
from shared.envs.runner import run_episode
from shared.envs.selection import pick_tasks
from shared.llm.client import LLMClient
from shared.messages import Sampling
from shared.stats import pass_hat_k, wilson


async def _measure(
    client: LLMClient, env_name: str, split: str, mode: str, args: argparse.Namespace
) -> dict:
    env = get_environment(env_name)
    tasks = pick_tasks([t for t in env.tasks() if t.split == split], args.tasks)
    trials = 1 if mode == "greedy" else args.trials
    sampling = Sampling(
        temperature=0.0 if mode == "greedy" else 1.0, max_tokens=args.max_tokens, seed=1234
    )
    gate = asyncio.Semaphore(args.concurrency)
    started = time.perf_counter()

    async def one(task_index: int, trial: int) -> tuple[str, str, bool, float, bool]:
        task = tasks[task_index]
        seeded = Sampling(
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed + 7919 * trial,
        )
        async with gate:
            r = await run_episode(
                client,
                "smollm2",
                env,
                task,
                int(task.data.get("seed", 0)),
                sampling=seeded,
                max_turns=args.max_turns,
            )
        return task.id, task.kind, r.score.success, r.score.reward, r.error is not None

    results = await asyncio.gather(*(one(i, k) for i in range(len(tasks)) for k in range(trials)))
    wall = time.perf_counter() - started
    wins = sum(1 for _, _, ok, _, _ in results if ok)
    per_task: dict[str, list[bool]] = defaultdict(list)
    per_kind: dict[str, list[float]] = defaultdict(list)
    for task_id, kind, ok, reward, _ in results:
        per_task[task_id].append(ok)
        per_kind[kind].append(reward)
    low, high = wilson(wins, len(results))
    return {
        "env": env_name,
        "split": split,
        "mode": mode,
        "tasks": len(tasks),
        "trials": trials,
        "episodes": len(results),
        "successes": wins,
        "pass_rate": wins / len(results),
        "ci95": [low, high],
        "mean_reward": sum(r for *_, r, _ in results) / len(results),
        "pass_hat_k": {
            k: pass_hat_k([(sum(v), len(v)) for v in per_task.values()], k)
            for k in range(1, trials + 1)
        },
        "mean_reward_by_kind": {k: sum(v) / len(v) for k, v in sorted(per_kind.items())},
        "errors": sum(1 for *_, e in results if e),
        "wall_s": wall,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", nargs="+", default=["toolbox", "helpdesk"])
    parser.add_argument("--splits", nargs="+", default=["train", "test"])
    parser.add_argument(
        "--modes", nargs="+", choices=["greedy", "sampled"], default=["greedy", "sampled"]
    )
    parser.add_argument(
        "--tasks", type=int, default=24, help="Tasks per (env, split), spread over kinds."
    )
    parser.add_argument("--trials", type=int, default=3, help="Trials per task at temperature 1.0.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--url", default=None, help="Use a running endpoint instead of starting one."
    )
    parser.add_argument("--port", type=int, default=8912)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    url = args.url or f"http://127.0.0.1:{args.port}"
    proc = None
    if args.url is None:
        proc = spawn(args.port, args.threads)
        await wait_up(url, proc)
    rows = []
    try:
        async with LLMClient(url) as client:
            for env_name in args.envs:
                for split in args.splits:
                    for mode in args.modes:
                        row = await _measure(client, env_name, split, mode, args)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                        if args.out:
                            args.out.parent.mkdir(parents=True, exist_ok=True)
                            args.out.write_text(
                                json.dumps(
                                    {
                                        "settings": {k: str(v) for k, v in vars(args).items()},
                                        "rows": rows,
                                    },
                                    indent=2,
                                )
                            )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    asyncio.run(main())
