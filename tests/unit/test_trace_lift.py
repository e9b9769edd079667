"""The trace_lift benchmark's tables: methods paired on the same tasks and trials, the oracle
as the evaluator picks it, wall time and rollouts per method, and the Markdown it prints."""

from __future__ import annotations

from pathlib import Path

import msgspec

from benchmarks.trace_lift import markdown, oracle_outcomes, plots, table
from services.evaluator.report import config_stats, oracle

TASKS = [f"t{i}" for i in range(8)]
KINDS = dict.fromkeys(TASKS, "single")


def trials(pattern: str) -> list[tuple[bool, float]]:
    return [(c == "1", 1.0 if c == "1" else 0.2) for c in pattern]


def collected() -> dict:
    outcomes = {
        "base": {t: trials("0001") for t in TASKS},
        "adapter:bot--alarms--v1": {
            t: trials("1101" if i < 4 else "0000") for i, t in enumerate(TASKS)
        },
        "baseline:grpo_target": {t: trials("0011") for t in TASKS},
        "baseline:gepa": {t: trials("0001") for t in TASKS},
    }
    routing = {t: ("adapter:bot--alarms--v1" if i < 4 else "base") for i, t in enumerate(TASKS)}
    outcomes["routed"] = {t: outcomes[routing[t]][t] for t in TASKS}
    configs = {k: msgspec.to_builtins(config_stats(k, v, KINDS)) for k, v in outcomes.items()}
    ceiling = oracle({k: v for k, v in outcomes.items() if k == "base" or k.startswith("adapter:")})
    return {
        "outcomes": outcomes,
        "report": {
            "configs": configs,
            "oracle": ceiling,
            "routing": routing,
            "rollouts_spent": {"routed": 32, "baseline:grpo_target": 32, "baseline:gepa": 32},
        },
        "training": [
            {"kind": "grpo", "capability": "alarms", "rollouts": 32, "wall_s": 600.0},
            {"kind": "grpo", "capability": None, "rollouts": 32, "wall_s": 900.0},
            {"kind": "gepa", "capability": None, "rollouts": 32, "wall_s": 300.0},
        ],
        "heldout": {"bot--alarms--v1": {"gain": 0.2, "ci95": [0.05, 0.35], "capability": "alarms"}},
    }


def test_the_oracle_is_the_evaluator_s() -> None:
    c = collected()
    best = oracle_outcomes(c["outcomes"])
    successes = sum(ok for t in best.values() for ok, _ in t)
    assert successes / 32 == c["report"]["oracle"]["pass_rate"] == 0.5


def test_methods_are_tabled_and_paired_against_base_and_trace() -> None:
    rows, pairs = table(collected())
    by = {r["method"]: r for r in rows}
    assert set(by) == {
        "base", "TRACE (routed)", "GRPO on the target", "GEPA", "oracle routing (ceiling)",
    }  # fmt: skip
    assert by["TRACE (routed)"]["pass_rate"] == 0.5 and by["base"]["pass_rate"] == 0.25
    assert by["TRACE (routed)"]["training_wall_s"] == 600.0
    assert by["GRPO on the target"]["training_wall_s"] == 900.0
    assert by["GEPA"]["training_rollouts"] == 32
    versus = {(p["method"], p["against"]): p for p in pairs}
    assert versus[("TRACE (routed)", "base")]["diff"] == 0.25
    assert versus[("GEPA", "base")]["diff"] == 0.0 and versus[("GEPA", "base")]["mcnemar_p"] == 1
    assert ("base", "base") not in versus and ("GRPO on the target", "routed") in versus
    text = markdown(rows, pairs)
    assert "| TRACE (routed) | 32 | 50.0% [" in text and "| GEPA | base | +0.000" in text


def test_plots_are_written(tmp_path: Path) -> None:
    c = collected()
    rows, _ = table(c)
    written = plots(c, rows, tmp_path / "trace_lift_cpu")
    assert [p.name for p in written] == [
        "trace_lift_cpu_pass_rate.png",
        "trace_lift_cpu_capability_gains.png",
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)
