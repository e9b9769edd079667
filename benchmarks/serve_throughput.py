"""Rollout throughput against `retrace serve-model` at several concurrencies, versus plain
sequential `model.generate` in one process.

    python -m benchmarks.serve_throughput --concurrency 1 8 32 --out docs/bench/throughput.json

Starts `retrace serve-model` as a subprocess, runs toolbox episodes through the same runner the
rollout service uses, and reads the server's generated-token counter from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import time
from pathlib import Path

import aiohttp

from benchmarks.model_server import spawn, wait_up
from shared.envs.registry import get_environment
from shared.envs.runner import run_episode
from shared.llm.client import LLMClient
from shared.messages import Sampling


async def _generated_tokens(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    match = re.search(r"^retrace_model_generated_tokens (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def _load(
    url: str, concurrency: int, episodes: int, args: argparse.Namespace
) -> dict[str, float]:
    env = get_environment("toolbox")
    tasks = [t for t in env.tasks() if t.split == "train"][:episodes]
    gate = asyncio.Semaphore(concurrency)
    sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    async with LLMClient(url) as client:
        before = await _generated_tokens(url)
        started = time.perf_counter()

        async def one(i: int) -> int:
            async with gate:
                result = await run_episode(
                    client,
                    "smollm2",
                    env,
                    tasks[i],
                    int(tasks[i].data["seed"]),
                    sampling=sampling,
                    max_turns=args.max_turns,
                )
                return result.turns

        turns = await asyncio.gather(*(one(i) for i in range(len(tasks))))
        wall = time.perf_counter() - started
        generated = await _generated_tokens(url) - before
    return {
        "concurrency": concurrency,
        "episodes": len(tasks),
        "turns": sum(turns),
        "wall_s": wall,
        "episodes_per_s": len(tasks) / wall,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / wall,
    }


def _sequential_generate(args: argparse.Namespace, prompts: int) -> dict[str, float]:
    """The baseline: the first-turn prompts of the same tasks, one `generate` call after another."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared.envs.protocol import Message
    from shared.llm.openai_types import ChatRequest
    from shared.serving.model_files import resolve_model
    from shared.serving.prompts import PromptBuilder

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    builder = PromptBuilder(tok)
    env = get_environment("toolbox")
    tasks = [t for t in env.tasks() if t.split == "train"][:prompts]
    generated = 0
    started = time.perf_counter()
    for task in tasks:
        ep = env.reset(task, int(task.data["seed"]))
        req = ChatRequest(
            model="smollm2",
            messages=[Message(role="system", content=ep.system_prompt), *ep.messages],
            tools=ep.tools,
        )
        ids, _ = builder.build(req)
        inputs = torch.tensor([ids])
        with torch.inference_mode():
            out = model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=args.max_tokens,
                do_sample=args.temperature > 0,
                temperature=args.temperature or None,
                pad_token_id=tok.eos_token_id,
            )
        generated += out.shape[1] - inputs.shape[1]
    wall = time.perf_counter() - started
    return {
        "prompts": len(tasks),
        "wall_s": wall,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / wall,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes-per-level", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--baseline-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=8911)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    baseline = _sequential_generate(args, args.baseline_prompts)
    print("sequential generate:", json.dumps(baseline), flush=True)
    url = f"http://127.0.0.1:{args.port}"
    proc = spawn(args.port, args.threads)
    levels = []
    try:
        await wait_up(url, proc)
        for concurrency, episodes in zip(args.concurrency, args.episodes_per_level, strict=True):
            level = await _load(url, concurrency, episodes, args)
            level["ratio_vs_sequential"] = (
                level["generated_tokens_per_s"] / baseline["generated_tokens_per_s"]
            )
            print("serve-model:", json.dumps(level), flush=True)
            levels.append(level)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "threads": args.threads,
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "sequential": baseline,
        "serve_model": levels,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    asyncio.run(main())
