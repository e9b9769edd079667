"""`retrace demo` asks `retrace improve` for a seeded cycle: the diagnosis decides what the
demo trains, and unseeded, three demos of one machine class chose three capabilities to
train (docs/benchmarks.md, the sixteenth run). The real run: `retrace demo` itself
(docs/benchmarks.md; tests/e2e run `retrace improve` on the embedded defaults)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from shared.cli import demo as demo_cli
from shared.messages import CycleSettings


@pytest.fixture
def called(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """The `retrace` commands the demo runs, with nothing started."""
    calls: list[tuple[str, ...]] = []

    @contextlib.contextmanager
    def nothing_up(*args: object) -> Iterator[None]:
        yield

    def record(*args: str, **kwargs: object) -> int:
        calls.append(args)
        return 0

    monkeypatch.setattr(demo_cli, "running_up", nothing_up)
    monkeypatch.setattr(demo_cli, "ensure_agent", lambda *a: None)
    monkeypatch.setattr(demo_cli, "_retrace", record)
    previous = signal.getsignal(signal.SIGTERM)
    yield calls
    signal.signal(signal.SIGTERM, previous)  # the demo takes SIGTERM over


def improve_seed(calls: list[tuple[str, ...]]) -> int:
    [improve] = [c for c in calls if c[0] == "improve"]
    return int(improve[improve.index("--seed") + 1])


def test_the_demo_runs_a_cycle_with_the_settings_default_seed(
    called: list[tuple[str, ...]], tmp_path: Path
) -> None:
    result = CliRunner().invoke(demo_cli.demo, ["--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert improve_seed(called) == CycleSettings().seed == 1234


def test_another_seed_is_passed_on(called: list[tuple[str, ...]], tmp_path: Path) -> None:
    result = CliRunner().invoke(demo_cli.demo, ["--out", str(tmp_path), "--seed", "7"])
    assert result.exit_code == 0, result.output
    assert improve_seed(called) == 7
