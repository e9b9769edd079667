"""`retrace rollout` through the real CLI and a real rollout service on embedded defaults; the
model is the oracle fake (the real one is covered by tests/model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.envs.registry import get_environment
from tests.e2e.test_cli_up import cli, env, running_up  # noqa: F401  (fixture)
from tests.support.oracle_llm import OracleLLM, serve_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_rollout_command_runs_episodes_and_summarises(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    toolbox = get_environment("toolbox")
    with serve_in_thread(OracleLLM(toolbox).app()) as model_url:
        env = {**env, "RETRACE_MODEL_URL": model_url}
        with running_up(env, "rollout", "api", first_port=23000):
            made = cli(env, "agent", "create", "bot", "--model", "oracle", "--env", "toolbox")
            assert made.returncode == 0, made.stderr
            result = cli(
                env,
                "rollout",
                "bot",
                "--tasks",
                "6",
                "--trials",
                "2",
                "--temperature",
                "0",
                "--wait",
                "60",
                timeout=200,
            )
            assert result.returncode == 0, result.stderr + result.stdout
            out = result.stdout
            assert "rollout summary" in out
            row = next(line for line in out.splitlines() if re.search(r"\ball\b", line))
            assert "12" in row and "100.0%" in row, out
            for kind in {t.kind for t in toolbox.tasks()}:
                assert kind in out
            missing = cli(env, "rollout", "nobody")
            assert missing.returncode == 1 and "no agent named 'nobody'" in missing.stderr


def test_a_plugin_environment_is_listed_and_rolled_out(
    env: dict[str, str],  # noqa: F811
) -> None:
    """The worked example, installed as a package, through the same CLI and services: its
    references played by the oracle earn full reward."""
    desk = get_environment("hotel-desk")
    listed = cli(env, "env", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "hotel-desk" in line)
    assert "retrace-hotel-desk" in row and "48" in row and "ok" in row, listed.stdout
    with serve_in_thread(OracleLLM(desk).app()) as model_url:
        env = {**env, "RETRACE_MODEL_URL": model_url}
        with running_up(env, "rollout", "api", first_port=23100):
            made = cli(env, "agent", "create", "desk", "--model", "oracle", "--env", "hotel-desk")
            assert made.returncode == 0, made.stderr
            result = cli(
                env, "rollout", "desk", "--tasks", "8", "--trials", "1", "--temperature", "0",
                "--wait", "60", timeout=200,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr + result.stdout
            row = next(line for line in result.stdout.splitlines() if re.search(r"\ball\b", line))
            assert "8" in row and "100.0%" in row, result.stdout
