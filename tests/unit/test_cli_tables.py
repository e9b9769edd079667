"""CLI tables: every value sits under its own header."""

from __future__ import annotations

import io

from rich.console import Console

from shared.cli import capabilities as cli


def test_capabilities_table_has_a_header_per_value(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=200, color_system=None))
    cli.print_capabilities(
        [
            {
                "name": "look_up_before_acting",
                "status": "synthesized",
                "statistics": {
                    "kept": True,
                    "coverage": 0.5,
                    "delta": 0.4,
                    "delta_std": 0.05,
                    "runs_passed": 9,
                    "runs": 10,
                },
                "evidence": {"failed_examples": ["t1", "t2", "t3"]},
            }
        ]
    )
    lines = out.getvalue().splitlines()
    [header] = [line for line in lines if line.startswith("┃")]
    [row] = [line for line in lines if line.startswith("│")]
    cells = [c.strip() for c in header.split("┃")[1:-1]]
    values = [c.strip() for c in row.split("│")[1:-1]]
    assert len(cells) == len(values) == 7
    table = dict(zip(cells, values, strict=True))
    assert table["verdict"] == "kept" and table["status"] == "synthesized"
    assert table["coverage"] == "0.50" and table["runs passed"] == "9/10"
