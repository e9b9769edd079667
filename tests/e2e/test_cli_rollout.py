"""`retrace rollout` through the real CLI and a real rollout service on embedded defaults; the
model is the oracle fake (the real one is covered by tests/model)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shared.envs.registry import get_environment
from tests.e2e.test_cli_up import RETRACE, _ports_free, cli, env  # noqa: F401  (fixture)
from tests.support.oracle_llm import OracleLLM, serve_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_rollout_command_runs_episodes_and_summarises(env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    toolbox = get_environment("toolbox")
    with serve_in_thread(OracleLLM(toolbox).app()) as model_url:
        env = {**env, "RETRACE_MODEL_URL": model_url}
        offset = next(o for o in range(23_000, 40_000, 37) if _ports_free(o))
        up = subprocess.Popen(
            [*RETRACE, "up", "--only", "rollout", "--port-offset", str(offset)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while cli(env, "status").returncode != 0:
                assert up.poll() is None and time.monotonic() < deadline
                time.sleep(1)
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
        finally:
            up.send_signal(signal.SIGTERM)
            up.communicate(timeout=90)
