"""`retrace diagnose`, `capabilities` and `synthesize` through the real CLI and the rollout,
contrast and synthesize services on embedded defaults; the model is the oracle fake, told to
fail half the tasks by answering without tools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.envs.registry import get_environment
from shared.envs.selection import pick_tasks
from tests.e2e.test_cli_up import cli, env, running_up  # noqa: F401  (fixture)
from tests.support.oracle_llm import OracleLLM, serve_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_diagnose_then_capabilities(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    toolbox = get_environment("toolbox")
    sample = pick_tasks([t for t in toolbox.tasks() if t.split == "train"], 12)
    failing = {t.id for i, t in enumerate(sample) if i % 2 == 0}
    with serve_in_thread(OracleLLM(toolbox, fail=failing).app()) as model_url:
        env = {
            **env,
            "RETRACE_MODEL_URL": model_url,
            # A tiny calibration: the oracle knows no synthetic task, so it is rejected at once.
            "RETRACE_SYNTHESIZE_CALIBRATION_TASKS": "4",
            "RETRACE_SYNTHESIZE_CALIBRATION_SAMPLES": "2",
            "RETRACE_SYNTHESIZE_MAX_REGENERATIONS": "0",
        }
        with running_up(env, "rollout", "contrast", "synthesize", "api", first_port=24000):
            assert (
                cli(
                    env, "agent", "create", "bot", "--model", "oracle", "--env", "toolbox"
                ).returncode
                == 0
            )
            none_yet = cli(env, "capabilities", "bot")
            assert none_yet.returncode == 1 and "no diagnosis" in none_yet.stderr
            result = cli(
                env,
                "diagnose",
                "bot",
                "--tasks",
                "12",
                "--trials",
                "1",
                "--wait",
                "60",
                timeout=200,
            )
            assert result.returncode == 0, result.stderr + result.stdout
            assert "use_tools_when_needed" in result.stdout and "kept" in result.stdout, (
                result.stdout
            )
            out_json, out_png = tmp_path / "caps.json", tmp_path / "caps.png"
            shown = cli(env, "capabilities", "bot", "--json", str(out_json), "--plot", str(out_png))
            assert shown.returncode == 0, shown.stderr
            caps = json.loads(out_json.read_text())
            kept = [c["name"] for c in caps if c["statistics"]["kept"]]
            assert "use_tools_when_needed" in kept
            top = next(c for c in caps if c["name"] == "use_tools_when_needed")
            assert top["statistics"]["coverage"] == pytest.approx(1.0)
            assert len(top["evidence"]["failures_covered"]) == len(failing)
            assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            synthesized = cli(env, "synthesize", "bot", "--wait", "120", timeout=200)
            assert synthesized.returncode == 0, synthesized.stderr + synthesized.stdout
            assert "synthetic/" in synthesized.stdout and "failed" in synthesized.stdout, (
                synthesized.stdout
            )
            # nothing calibrated, so nothing to train: said plainly, nothing queued
            trained = cli(env, "train", "bot", "--wait", "10")
            assert trained.returncode == 1 and "no calibrated environment" in trained.stderr
            listed = cli(env, "adapters", "bot")
            assert listed.returncode == 0 and "no adapters" in listed.stdout


def test_improve_follows_a_cycle_to_its_end(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """The whole chain through real services: the oracle fails half the toolbox tasks, so
    contrast keeps a capability; it knows no synthetic task, so calibration fails; the cycle
    then measures the base model on the test split and completes rejected with the reason, and
    `retrace report` says so too."""
    with _improved(env, "toolbox", "bot", first_port=25000) as (env, result):
        reason = "nothing to promote: no capability got a calibrated environment"
        assert reason in " ".join(result.stdout.split()), result.stdout
        shown = cli(env, "report", "bot", "--out", str(tmp_path / "report"))
        assert shown.returncode == 0, shown.stderr
        assert reason in " ".join(shown.stdout.split())
        markdown = (tmp_path / "report" / "report.md").read_text()
        assert markdown.startswith("# retrace cycle") and "base" in markdown
        status = cli(env, "status")
        assert "completed" in status.stdout, status.stdout


def test_improve_on_a_plugin_environment(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """The same chain on the worked plug-in example (issue 15): the installed `hotel-desk`
    package is diagnosed, its capability gets an environment derived from the hotel's own
    tasks, which the oracle (it fails those very tasks) cannot pass, so the cycle measures the
    base model on the hotel's test split and completes rejected, with the reason."""
    with _improved(env, "hotel-desk", "desk", first_port=25200) as (env, result):
        said = " ".join(result.stdout.split())
        assert "nothing to promote: no capability got a calibrated environment" in said, said
        shown = cli(env, "capabilities", "desk", "--json", str(tmp_path / "caps.json"))
        assert shown.returncode == 0, shown.stderr
        kept = [c["name"] for c in json.loads((tmp_path / "caps.json").read_text())]
        assert "use_tools_when_needed" in kept, kept
        assert "use_tools_when_needed: calibration failed" in said and "too hard" in said, said


@contextmanager
def _improved(
    env: dict[str, str],  # noqa: F811
    environment: str,
    agent: str,
    *,
    first_port: int,
) -> Iterator[tuple[dict[str, str], Any]]:
    """`retrace improve` (the tests' small budgets; it must exit 0) for a new agent on
    `environment` whose model is the oracle, told to fail half of 12 train tasks by answering
    without tools; the services stay up, and the environment is yielded, for the block."""
    target = get_environment(environment)
    sample = pick_tasks([t for t in target.tasks() if t.split == "train"], 12)
    failing = {t.id for i, t in enumerate(sample) if i % 2 == 0}
    with serve_in_thread(OracleLLM(target, fail=failing).app()) as model_url:
        env = {
            **env,
            "RETRACE_MODEL_URL": model_url,
            # a tiny calibration: the oracle passes no synthetic task, so it is rejected at once
            "RETRACE_SYNTHESIZE_CALIBRATION_TASKS": "4",
            "RETRACE_SYNTHESIZE_CALIBRATION_SAMPLES": "2",
            "RETRACE_SYNTHESIZE_MAX_REGENERATIONS": "0",
        }
        with running_up(
            env, "rollout", "contrast", "synthesize", "evaluator", "api", first_port=first_port
        ):
            made = cli(env, "agent", "create", agent, "--model", "oracle", "--env", environment)
            assert made.returncode == 0, made.stderr
            result = cli(
                env, "improve", agent, "--diagnose-tasks", "12", "--diagnose-trials", "1",
                "--eval-tasks", "8", "--eval-trials", "1", "--wait", "200", timeout=260,
            )  # fmt: skip
            assert result.returncode == 0, result.stdout + result.stderr
            yield env, result
