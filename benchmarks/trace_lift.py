"""Whether TRACE works here: base, TRACE (the routed adapters), oracle routing, GRPO on the
target, and GEPA, at the same training-rollout budget, each on the target's held-out test split.

    python -m benchmarks.trace_lift --config cpu            # 2 CPU cores: Qwen on serve-model
    python -m benchmarks.trace_lift --config gpu            # RETRACE_MODEL_URL: vLLM on a GPU

One cycle of the real services (`retrace up` on the embedded NATS and Postgres under
--data-dir, or the running ones with --attach), with both baselines on. Resumable: the cycle's
id is kept in `<data dir>/trace_lift.json`; the same command after a stop starts the services
on the same data directory and follows that cycle, whose stages pick up from Postgres and
NATS where they were. When it ends, the numbers go to `docs/bench/trace_lift_<config>.json`,
two plots beside it (pass rate against training rollouts; per-capability gains), and the
Markdown table for docs/benchmarks.md to stdout.

Methods, all evaluated on the same test tasks and seeds with `eval_trials` trials per task:
- base: the agent's model as it is;
- TRACE: the new adapters, one chosen per task by the cycle's router;
- oracle: per task, the best of base and each adapter (the routing ceiling, not deployable);
- GRPO on the target: one adapter trained on the target's own train tasks;
- GEPA: the reflective prompt optimiser, spending the same rollouts.
Diagnosis, synthesis and training only ever see the train split.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from services.evaluator.report import compare
from shared.cli.context import load_settings, open_store
from shared.cli.control import ControlApi
from shared.cli.demo import CPU_DEFAULTS, ensure_agent, running_up
from shared.cli.improve import follow_cycle, request_cycle
from shared.messages import CycleSettings
from shared.serving.packaged import DEFAULT_AGENT_MODEL
from shared.store.agents import get_agent
from shared.store.models import Adapter, Capability, Cycle, Task, TrainingJob, Trajectory

AGENT = "lift-bot"
CONFIGS: dict[str, dict[str, Any]] = {
    # Sized for 2 CPU cores and at most 3 hours. Measured in the first run (docs/benchmarks.md):
    # diagnosis and calibration 12 minutes; GRPO on the toolbox target 141 to 908 s a step
    # (3,000-token prompts). Estimated from those: training and held-out checks about 80
    # minutes one job at a time (RETRACE_TRAIN_MAX_JOBS=1: three at once ran out of memory),
    # and 4 configurations (base, the adapter, the two baselines) x 6 test tasks x 4 trials =
    # 96 evaluation episodes, about 40 minutes: about 2.2 hours with the machine to itself.
    # 24 episodes per method give a pass-rate interval of about +-0.2 at a rate near 0.5
    # (less near 0): large effects only.
    "cpu": {
        "diagnose_tasks": 12,
        "diagnose_trials": 2,
        "eval_tasks": 6,
        "eval_trials": 4,
        "rollout_budget": 32,
        "max_tokens": 128,
        "max_capabilities": 1,
        "route_tasks": 0,
        "baselines": ["grpo_target", "gepa"],
        "eval_adapters": "all",  # the oracle and each adapter alone need every task
    },
    # A GPU behind RETRACE_MODEL_URL: the paper's budgets, every test task.
    "gpu": {
        "diagnose_tasks": 48,
        "diagnose_trials": 4,
        "eval_tasks": None,
        "eval_trials": 4,
        "rollout_budget": 256,
        "max_tokens": 256,
        "max_capabilities": None,
        "route_tasks": 24,
        "baselines": ["grpo_target", "gepa"],
        "eval_adapters": "all",
    },
}
ORACLE = "oracle"


def _state_file(data_dir: Path) -> Path:
    return data_dir / "trace_lift.json"


async def _run_cycle(args: argparse.Namespace, settings: CycleSettings) -> uuid.UUID:
    """The cycle this benchmark follows: the one it started before, or a new one."""
    cfg = load_settings()
    state = _state_file(args.data_dir)
    known = json.loads(state.read_text()) if state.exists() else {}
    if known.get("config") not in (None, args.config):
        raise SystemExit(f"{state} belongs to the {known['config']} configuration")
    cycle_id = uuid.UUID(known["cycle_id"]) if "cycle_id" in known else uuid.uuid4()
    if "cycle_id" not in known:
        state.write_text(json.dumps({"config": args.config, "cycle_id": str(cycle_id)}))
    # Asking again is harmless: the cycle's id is the request's.
    async with ControlApi.connect(cfg, "default") as api:
        await request_cycle(api, AGENT, settings, cycle_id)
        await follow_cycle(api, cycle_id, args.wait_s)
    return cycle_id


async def _collect(cycle_id: uuid.UUID) -> dict[str, Any]:
    cfg = load_settings()
    async with open_store(cfg) as store, store.tenant("default") as session:
        cycle = await session.get(Cycle, cycle_id)
        assert cycle is not None
        agent = await get_agent(session, AGENT)
        jobs = list(
            await session.scalars(select(TrainingJob).where(TrainingJob.cycle_id == cycle_id))
        )
        adapters = list(await session.scalars(select(Adapter).where(Adapter.cycle_id == cycle_id)))
        capabilities = {
            c.id: c.name
            for c in await session.scalars(
                select(Capability).where(Capability.cycle_id == cycle_id)
            )
        }
        created, updated = cycle.created_at, cycle.updated_at
        report = (cycle.data or {}).get("report") or {}
        state, reason = cycle.state, cycle.reason
        outcomes = {
            name: await _outcomes(session, uuid.UUID(request))
            for name, request in (
                ((cycle.data or {}).get("evaluation") or {}).get("requests") or {}
            ).items()
        }
    if "base" in outcomes:  # the routed set plays, per task, what the router chose there
        decisions = report.get("routing") or {}
        outcomes["routed"] = {
            task: outcomes.get(decisions.get(task, "base"), {}).get(task, trials)
            for task, trials in outcomes["base"].items()
        }
    return {
        "agent_model": agent.model,
        "state": state,
        "reason": reason,
        "cycle_wall_s": round((updated - created).total_seconds(), 1),
        "report": report,
        "outcomes": outcomes,
        "training": [
            {
                "kind": j.config.get("kind", "grpo"),
                "capability": capabilities.get(j.capability_id) if j.capability_id else None,
                "rollouts": (j.config.get("progress") or {}).get("rollouts", 0),
                "wall_s": j.config.get("wall_s"),
                "status": j.status,
            }
            for j in jobs
        ],
        "heldout": {
            a.name: {
                **a.heldout,
                "capability": capabilities.get(a.capability_id) if a.capability_id else None,
            }
            for a in adapters
            if a.heldout
        },
    }


async def _outcomes(session: Any, request_id: uuid.UUID) -> dict[str, list[tuple[bool, float]]]:
    """Per test task, its trials in order (trial i of every method had the same seed)."""
    rows = await session.execute(
        select(Task.external_id, Trajectory.success, Trajectory.reward)
        .join(Task, Task.id == Trajectory.task_id)
        .where(Trajectory.request_id == request_id)
        .order_by(Task.external_id, Trajectory.trial)
    )
    out: dict[str, list[tuple[bool, float]]] = {}
    for task, success, reward in rows:
        out.setdefault(task, []).append((bool(success), float(reward or 0.0)))
    return out


def methods(collected: dict[str, Any]) -> dict[str, str]:
    """Display name -> the evaluation configuration behind it."""
    names = {"base": "base", "TRACE (routed)": "routed"}
    for config in collected["outcomes"]:
        if config == "baseline:grpo_target":
            names["GRPO on the target"] = config
        elif config == "baseline:gepa":
            names["GEPA"] = config
    return names


def oracle_outcomes(outcomes: dict[str, Any]) -> dict[str, list[tuple[bool, float]]]:
    """Per task, the trials of the best of base and each adapter there: the highest success
    rate, ties to the earlier (base first), as the evaluator's oracle picks."""
    candidates = [k for k in outcomes if k == "base" or k.startswith("adapter:")]
    best: dict[str, list[tuple[bool, float]]] = {}
    for task in outcomes.get("base", {}):
        options = [outcomes[k][task] for k in candidates if task in outcomes[k]]
        best[task] = max(
            options,
            key=lambda trials: (sum(ok for ok, _ in trials) / len(trials), -options.index(trials)),
        )
    return best


def table(collected: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per method: pass rate with its interval, pass^k, reward, rollouts, training wall
    time; and each method paired against base and against TRACE."""
    configs = collected["report"].get("configs") or {}
    spent = collected["report"].get("rollouts_spent") or {}
    walls: dict[str, float] = {}
    for job in collected["training"]:
        key = _configuration_of(job)
        walls[key] = walls.get(key, 0.0) + float(job["wall_s"] or 0.0)
    outcomes = dict(collected["outcomes"])
    outcomes[ORACLE] = oracle_outcomes(outcomes)
    rows = []
    for name, config in methods(collected).items():
        s = configs.get(config)
        if s is None:
            continue
        rows.append(
            {
                "method": name,
                "episodes": s["episodes"],
                "pass_rate": s["pass_rate"],
                "ci95": s["ci95"],
                "pass_hat_k": s["pass_hat_k"],
                "mean_reward": s["mean_reward"],
                "training_rollouts": spent.get(config, 0),
                "training_wall_s": round(walls.get(config, 0.0), 1),
            }
        )
    oracle_report = collected["report"].get("oracle") or {}
    if "pass_rate" in oracle_report:
        rows.append({"method": "oracle routing (ceiling)", **oracle_report})
    pairs = []
    for name, config in [*methods(collected).items(), ("oracle routing", ORACLE)]:
        for other in ("base", "routed"):
            if config == other or config not in outcomes or other not in outcomes:
                continue
            c = compare(config, outcomes[config], other, outcomes[other], resamples=10_000)
            pairs.append(
                {
                    "method": name,
                    "against": other,
                    "diff": c.diff,
                    "diff_ci95": c.diff_ci95,
                    "mcnemar_p": c.mcnemar_p,
                    "bootstrap_p": c.bootstrap_p,
                }
            )
    return rows, pairs


def _configuration_of(job: dict[str, Any]) -> str:
    """The evaluated configuration a training job's adapter or prompt belongs to."""
    if job["kind"] == "gepa":
        return "baseline:gepa"
    return "routed" if job["capability"] else "baseline:grpo_target"


def plots(collected: dict[str, Any], rows: list[dict[str, Any]], stem: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    shown: dict[tuple[float, float], int] = {}
    for row in rows:
        if "training_rollouts" not in row:
            continue
        low, high = row["ci95"]
        rate = row["pass_rate"]
        at = (row["training_rollouts"], rate)
        ax.errorbar(
            *at,
            yerr=[[max(0.0, rate - low)], [max(0.0, high - rate)]],
            fmt="o",
            capsize=3,
        )
        stacked = shown.get(at, 0)  # methods on the same point: their labels one under another
        shown[at] = stacked + 1
        ax.annotate(row["method"], at, fontsize=7, xytext=(4, 4 - 9 * stacked),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("training rollouts spent")
    ax.set_ylabel("pass rate on the test split (95% CI)")
    fig.tight_layout()
    written.append(_save(fig, stem, "pass_rate"))
    held = collected["heldout"]
    if held:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [h.get("capability") or "GRPO on the target" for h in held.values()]
        gains = [h["gain"] for h in held.values()]
        errors = [
            [g - h["ci95"][0] for g, h in zip(gains, held.values(), strict=True)],
            [h["ci95"][1] - g for g, h in zip(gains, held.values(), strict=True)],
        ]
        ax.bar(range(len(names)), gains, yerr=errors, capsize=4)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("held-out reward gain over base\n(95% CI)")
        fig.tight_layout()
        written.append(_save(fig, stem, "capability_gains"))
    return written


def _save(fig: Any, stem: Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = stem.with_name(f"{stem.name}_{name}.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown(rows: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> str:
    lines = [
        "| method | episodes | pass rate [95% CI] | pass^k | mean reward | training rollouts "
        "| training wall |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if "episodes" not in r:
            lines.append(f"| {r['method']} | | {r['pass_rate']:.1%} | | | | |")
            continue
        k = max(r["pass_hat_k"], key=int) if r["pass_hat_k"] else None
        lines.append(
            f"| {r['method']} | {r['episodes']} | {r['pass_rate']:.1%} "
            f"[{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}] | "
            + (f"k={k}: {r['pass_hat_k'][k]:.1%}" if k else "-")
            + f" | {r['mean_reward']:.3f} | {r['training_rollouts']} | "
            f"{r['training_wall_s']:.0f} s |"
        )
    lines += ["", "| method | against | pass-rate difference [95% CI] | McNemar p | bootstrap p |",
              "|---|---|---|---:|---:|"]  # fmt: skip
    for p in pairs:
        low, high = p["diff_ci95"]
        lines.append(
            f"| {p['method']} | {p['against']} | {p['diff']:+.3f} [{low:+.3f}, {high:+.3f}] | "
            f"{p['mcnemar_p']:.3g} | {p['bootstrap_p']:.3g} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="cpu")
    parser.add_argument("--env", default="toolbox")
    parser.add_argument("--model", default=DEFAULT_AGENT_MODEL)
    parser.add_argument("--data-dir", type=Path, default=Path(".retrace-trace-lift"))
    parser.add_argument("--attach", action="store_true", help="use the running services")
    parser.add_argument("--port-offset", type=int, default=0)
    parser.add_argument("--wait-s", type=float, default=4 * 3600.0)
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    args = parser.parse_args()
    settings = CycleSettings(**CONFIGS[args.config])
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if not args.attach:
        os.environ.setdefault("RETRACE_STORAGE_DATA_DIR", str(args.data_dir))
        if args.config == "cpu":
            for name, value in CPU_DEFAULTS.items():
                os.environ.setdefault(name, value)
    started = time.monotonic()
    services = (
        contextlib.nullcontext()
        if args.attach
        else running_up(600.0, args.port_offset, "trace-lift-up.log")
    )
    with services:
        ensure_agent(AGENT, args.model, args.env)
        cycle_id = asyncio.run(_run_cycle(args, settings))
        collected = asyncio.run(_collect(cycle_id))
    rows, pairs = table(collected)
    stem = args.out / f"trace_lift_{args.config}"
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": args.config,
        "settings": CONFIGS[args.config],
        "environment": args.env,
        "model": collected["agent_model"],
        "cycle": str(cycle_id),
        "state": collected["state"],
        "reason": collected["reason"],
        "cycle_wall_s": collected["cycle_wall_s"],
        "this_run_wall_s": round(time.monotonic() - started, 1),
        "methods": rows,
        "paired": pairs,
        "heldout": collected["heldout"],
        "training": collected["training"],
    }
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    written = plots(collected, rows, stem)
    print(markdown(rows, pairs))
    print(f"\nwrote {stem.with_suffix('.json')}, " + ", ".join(str(p) for p in written))


if __name__ == "__main__":
    main()
