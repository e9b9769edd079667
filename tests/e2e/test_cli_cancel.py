"""Progress and `retrace cancel` through the real CLI and services: a cycle's diagnosis
rollout shows as a running job with its progress in `retrace status`, and `retrace cancel`
ends the cycle and stops the job."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from shared.envs.registry import get_environment
from tests.e2e.test_cli_up import cli, env, running_up  # noqa: F401  (fixture)
from tests.support.oracle_llm import OracleLLM, serve_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def _status(env: dict[str, str]) -> dict[str, Any]:  # noqa: F811
    shown = cli(env, "status", "--json")
    assert shown.stdout, shown.stderr
    return dict(json.loads(shown.stdout))


def _until(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError("timed out")


def test_a_running_cycle_shows_its_progress_and_is_cancelled(env: dict[str, str]) -> None:  # noqa: F811
    toolbox = get_environment("toolbox")
    # the diagnosis must outlast the status calls below: two tasks' episodes are answered
    # (its progress), the rest wait until the cycle is cancelled. A delay of 3 s a reply was
    # not enough where a CLI call took seconds (the job ended before `cancel` came).
    held = threading.Event()
    oracle = OracleLLM(toolbox, delay=0.5, hold=held, pass_first=2)
    with serve_in_thread(oracle.app()) as model_url:
        env = {**env, "RETRACE_MODEL_URL": model_url}
        with running_up(
            env, "rollout", "contrast", "synthesize", "evaluator", "api", first_port=26000
        ):
            made = cli(env, "agent", "create", "bot", "--model", "oracle", "--env", "toolbox")
            assert made.returncode == 0, made.stderr
            # followed for 3 s only: the cycle goes on without its follower
            started = cli(
                env, "improve", "bot", "--diagnose-tasks", "12", "--diagnose-trials", "2",
                "--wait", "3",
            )  # fmt: skip
            assert started.returncode == 1 and "did not end in time" in started.stderr

            def running() -> dict[str, Any] | None:
                jobs = [w for w in _status(env)["work"] if w["done"] >= 1]
                return jobs[0] if jobs else None

            job = _until(running, within=120)
            assert job["kind"] == "rollout" and job["total"] == 24 and job["unit"] == "episodes"
            assert job["label"].startswith("diagnose toolbox") and job["rate_per_min"] > 0
            [cycle] = _status(env)["active"]
            assert job["cycle"] == cycle["cycle"] and cycle["state"] == "diagnosing"
            human = cli(env, "status")
            assert "running jobs" in human.stdout and "/24 episodes" in human.stdout

            cancelled = cli(env, "cancel", cycle["cycle"])
            held.set()
            assert cancelled.returncode == 0, cancelled.stderr
            assert "cancelled cycle" in cancelled.stdout and "1 running job" in cancelled.stdout

            def stopped() -> bool:
                now = _status(env)
                return not now["work"] and not now["active"] and now["cycles"] == {"failed": 1}

            _until(stopped, within=60)
            again = cli(env, "cancel", cycle["cycle"])
            assert again.returncode == 1 and "already ended" in again.stderr
            unknown = cli(env, "cancel", "00000000-0000-0000-0000-000000000000")
            assert unknown.returncode == 1 and "retrace status" in unknown.stderr
