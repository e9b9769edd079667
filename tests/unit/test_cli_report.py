"""`retrace report`: the Markdown and PNG plots of a completed cycle, and its table."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
from rich.console import Console

from services.evaluator.report import compare, config_stats, oracle, verdict
from shared.cli import improve

KINDS = {f"t{i}": "alarm" for i in range(6)}


def snap() -> dict[str, object]:
    base = {t: [(False, 0.0), (False, 0.2)] for t in KINDS}
    routed = {t: [(True, 1.0), (True, 1.0)] for t in KINDS}
    configs = {"base": base, "routed": routed}
    comparison = compare("routed", routed, "base", base, resamples=500)
    report = {
        "configs": {k: msgspec.to_builtins(config_stats(k, v, KINDS)) for k, v in configs.items()},
        "comparison": msgspec.to_builtins(comparison),
        "oracle": oracle({"base": base}),
        "verdict": msgspec.to_builtins(verdict(comparison)),
        "incumbent": "base",
        "rollouts_spent": {"base": 0, "routed": 64},
        "training_wall_s": {"base": 0.0, "routed": 1834.6},
    }
    heldout = {
        "tasks": 6,
        "samples": 2,
        "episodes": 12,
        "base_mean": 0.25,
        "adapter_mean": 0.5,
        "gain": 0.25,
        "ci95": [0.1, 0.4],
        "p": 0.002,
        "better": True,
    }
    return {
        "state": "completed",
        "reason": "ok",
        "data": {"report": report},
        "heldout": {"bot--alarms--v1": heldout},
    }


def test_report_writes_markdown_and_plots(tmp_path: Path) -> None:
    curve = [{"rollouts": 16 * i, "mean_reward": 0.1 * i} for i in range(1, 4)]
    written = improve.write_report(snap(), [("bot--alarms--v1", curve)], tmp_path)
    names = sorted(p.name for p in written)
    assert names == [
        "pass_rate.png",
        "pass_rate_vs_rollouts.png",
        "report.md",
        "reward_curves.png",
    ]
    md = (tmp_path / "report.md").read_text()
    assert "| routed | 12 | 100.0% |" in md and "| base | 12 | 0.0% |" in md
    assert md.count("| 64 |") == 1  # the routed set's training rollouts
    assert "| 1835 s |" in md  # and its training wall time
    assert "McNemar p=" in md and "![pass rate per configuration](pass_rate.png)" in md
    assert "## Adapters on held-out synthetic tasks" in md
    assert "0.250 (base) -> 0.500 (adapter), gain +0.250 [95% CI +0.100, +0.400]" in md
    for png in ("pass_rate.png", "pass_rate_vs_rollouts.png", "reward_curves.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_table_and_verdict(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    monkeypatch.setattr(improve, "console", Console(file=out, width=200, color_system=None))
    improve.print_report(snap())
    text = out.getvalue()
    assert "routed" in text and "100.0% [" in text and "promoted: routed beats base" in text
    assert "bot--alarms--v1: held-out synthetic tasks (12 episodes, unhinted)" in text
    assert "better than the base" in text
    out.truncate(0)
    improve.print_report({"state": "failed", "error": "no capability", "data": {}})
    assert "cycle failed: no capability" in out.getvalue()


def test_a_cycle_that_trained_nothing_reports_the_base_model_and_why(
    monkeypatch,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    import msgspec

    base = {t: [(i % 2 == 0, 0.5)] for i, t in enumerate(KINDS)}
    comparison = compare("routed", base, "base", base, resamples=200)
    why = "no capability got a calibrated environment: too hard"
    report = {
        "configs": {
            k: msgspec.to_builtins(config_stats(k, base, KINDS)) for k in ("base", "routed")
        },
        "comparison": msgspec.to_builtins(comparison),
        "oracle": oracle({"base": base}),
        "verdict": {"promote": False, "reason": f"nothing to promote: {why}"},
        "incumbent": "base",
        "rollouts_spent": {"base": 0, "routed": 0},
        "untrained": why,
    }
    shot = {
        "state": "completed",
        "reason": f"nothing to promote: {why}",
        "data": {"report": report},
    }
    out = io.StringIO()
    monkeypatch.setattr(improve, "console", Console(file=out, width=200, color_system=None))
    improve.print_report(shot)
    text = out.getvalue()
    assert "50.0% [" in text and "routed vs base" not in text
    assert "the routed set is the base model" in text and f"kept: nothing to promote: {why}" in text
    improve.write_report(shot, [], tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| base | 6 | 50.0% |" in md and "McNemar" not in md and why in md


def routed_only_snap() -> dict[str, object]:
    """An adapter played only on the 2 tasks routed to it: no oracle ceiling."""
    data = snap()
    report = data["data"]["report"]  # type: ignore[index]
    adapter = {t: [(True, 1.0), (True, 1.0)] for t in ("t0", "t1")}
    report["configs"]["adapter:bot--alarms--v1"] = msgspec.to_builtins(
        config_stats("adapter:bot--alarms--v1", adapter, KINDS)
    )
    report["oracle"] = None
    report["played_on"] = {"adapter:bot--alarms--v1": 2}
    return data


def test_an_adapter_played_where_routed_is_labelled_and_the_ceiling_said_unmeasured(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    improve.write_report(routed_only_snap(), [], tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| adapter:bot--alarms--v1 (on the 2 tasks routed to it) | 4 | 100.0% |" in md
    assert "Oracle routing ceiling not measured" in md and "--eval-adapters all" in md
    out = io.StringIO()
    monkeypatch.setattr(improve, "console", Console(file=out, width=200, color_system=None))
    improve.print_report(routed_only_snap())
    text = out.getvalue()
    assert "(on the 2 tasks routed to it)" in text
    assert "oracle routing ceiling not measured" in text
