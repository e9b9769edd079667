"""`retrace report`: the Markdown and PNG plots of a completed cycle, and its table."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from services.evaluator.report import compare, config_stats, oracle, verdict
from shared.cli import improve

KINDS = {f"t{i}": "alarm" for i in range(6)}


def snap() -> dict[str, object]:
    base = {t: [(False, 0.0), (False, 0.2)] for t in KINDS}
    routed = {t: [(True, 1.0), (True, 1.0)] for t in KINDS}
    configs = {"base": base, "routed": routed}
    comparison = compare("routed", routed, "base", base, resamples=500)
    import msgspec

    report = {
        "configs": {k: msgspec.to_builtins(config_stats(k, v, KINDS)) for k, v in configs.items()},
        "comparison": msgspec.to_builtins(comparison),
        "oracle": oracle({"base": base}),
        "verdict": msgspec.to_builtins(verdict(comparison)),
        "incumbent": "base",
        "rollouts_spent": {"base": 0, "routed": 64},
    }
    return {"state": "completed", "reason": "ok", "data": {"report": report}}


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
    assert "McNemar p=" in md and "![pass rate per configuration](pass_rate.png)" in md
    for png in ("pass_rate.png", "pass_rate_vs_rollouts.png", "reward_curves.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_table_and_verdict(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    monkeypatch.setattr(improve, "console", Console(file=out, width=200, color_system=None))
    improve.print_report(snap())
    text = out.getvalue()
    assert "routed" in text and "100.0% [" in text and "promoted: routed beats base" in text
    out.truncate(0)
    improve.print_report({"state": "failed", "error": "no capability", "data": {}})
    assert "cycle failed: no capability" in out.getvalue()
