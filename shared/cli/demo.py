"""`retrace demo`: one whole TRACE cycle on a fresh machine, on the embedded defaults.

Starts `retrace up` (embedded NATS and Postgres, the seven services, the packaged
Qwen2.5-Coder-0.5B-Instruct served on CPU unless `RETRACE_MODEL_URL` names an endpoint),
registers the agent `demo-bot` on toolbox, runs `retrace improve` with a CPU budget (stated
up front), prints the report, writes it as Markdown and plots, and stops everything it
started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from shared.cli.context import make_console
from shared.serving.packaged import DEFAULT_AGENT_MODEL

console = make_console()
AGENT = "demo-bot"
CPU_DEFAULTS = {
    # Calibration rollouts on a CPU: 4 tasks x 4 samples per synthesized environment (one
    # batch), one adjustment round (the services' own defaults are the paper's 100 x 16, up
    # to 5 rounds). An environment still out of band after it gives its place to the next
    # capability in reserve: in the demos measured, rounds 2 to 4 never moved a hopeless
    # environment into band (docs/benchmarks.md).
    "RETRACE_SYNTHESIZE_CALIBRATION_TASKS": "4",
    "RETRACE_SYNTHESIZE_CALIBRATION_SAMPLES": "4",
    # No adjustment round: an environment out of band gives its place to the next capability
    # in reserve at once (the minutes go to training, which is where the gain came from).
    "RETRACE_SYNTHESIZE_MAX_REGENERATIONS": "0",
    # Calibration samples the policy as GRPO will: at most 4 turns of 96 tokens (a rejected
    # call, the retry and the report fit with one turn to spare).
    "RETRACE_SYNTHESIZE_MAX_TOKENS": "96",
    "RETRACE_SYNTHESIZE_MAX_TURNS": "4",
    # GRPO groups of 4 (the paper's 16): the demo's 64-rollout budget is 16 optimizer steps,
    # with at most 4 turns of 96 tokens per synthetic episode. With so few steps the paper's
    # learning rate (1e-5) would leave the adapter where it started: measured on this CPU, 8
    # steps at 1e-4 gave no held-out gain, 16 steps at 2e-4 gave +0.20 [0.04, 0.36]
    # (docs/benchmarks.md).
    "RETRACE_TRAIN_GROUP_SIZE": "4",
    "RETRACE_TRAIN_LEARNING_RATE": "2e-4",
    # Two steps' groups sampled as one batch of 8 from the same weights: on 2 cores a decode
    # step of 8 rows costs about 1.2 times one of 4 (docs/benchmarks.md, the raw forward
    # pass), and sampling is most of a step; every second step trains on rollouts one
    # update old.
    "RETRACE_TRAIN_SAMPLE_AHEAD": "1",
    "RETRACE_TRAIN_MAX_NEW_TOKENS": "96",
    "RETRACE_TRAIN_MAX_TURNS": "4",
    # One training job at a time: each holds its own copy of the model, and three at once
    # (an adapter and two baselines) were killed for memory on 24 GiB; on 2 cores running
    # them side by side gains nothing.
    "RETRACE_TRAIN_MAX_JOBS": "1",
    # The held-out check of each adapter: 32 test tasks x 2 seeds, each played by the adapter
    # and by the base model, 32 episodes in lockstep. With 24 pairs a pair's difference had a
    # standard deviation of about 0.43, so a gain of 0.15 needed about 64 pairs to be told
    # from noise with 80% power (docs/benchmarks.md, the tenth run); 12 x 2 showed no gain in 2
    # of the 5 demo runs that trained.
    "RETRACE_TRAIN_HELDOUT_TASKS": "32",
    "RETRACE_TRAIN_HELDOUT_SAMPLES": "2",
    "RETRACE_TRAIN_HELDOUT_BATCH": "32",
    # On a busy CPU a request can wait behind a batch of long generations; a timeout would
    # throw that work away.
    "RETRACE_MODEL_REQUEST_TIMEOUT": "1800",
    # At most 6 agent turns per episode (the rollout service's default is 12).
    "RETRACE_ROLLOUT_MAX_TURNS": "6",
    # 24 episodes at once: serve-model decodes them as one batch (a turn that arrives while
    # it runs joins it) and starts each turn from the keys and values its conversation left,
    # so throughput rises with concurrency (docs/benchmarks.md, engines).
    "RETRACE_ROLLOUT_EPISODES_AT_ONCE": "24",
}
"""Settings the demo gives the services unless already set in the environment."""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _retrace(*args: str, timeout: float | None = None, check: bool = False) -> int:
    return subprocess.run(
        [sys.executable, "-m", "shared.cli.main", *args], timeout=timeout, check=check
    ).returncode


@click.command("demo")
@click.option("--diagnose-tasks", type=int, default=12, show_default=True)
@click.option("--diagnose-trials", type=int, default=2, show_default=True)
@click.option("--eval-tasks", type=int, default=12, show_default=True)
@click.option("--eval-trials", type=int, default=2, show_default=True)
@click.option("--budget", type=int, default=64, show_default=True, help="Rollouts per adapter.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Per model turn.")
@click.option(
    "--max-capabilities",
    type=int,
    default=1,
    show_default=True,
    help="Adapters trained: the diagnosis's best N capabilities.",
)
@click.option(
    "--baseline/--no-baseline",
    default=False,
    show_default=True,
    help="Also train and evaluate the baselines (GRPO on the target, GEPA); on 2 CPU cores "
    "they roughly double the run.",
)
@click.option(
    "--seed",
    type=int,
    default=1234,
    show_default=True,
    help="Sampling seed of the diagnosis and evaluation rollouts (the same seed, the same "
    "diagnosis on a machine; another seed draws other episodes).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("retrace-demo-report"),
    show_default=True,
)
@click.option("--ready-timeout", type=float, default=600.0, show_default=True)
@click.option("--port-offset", default=0, show_default=True, help="Passed to `retrace up`.")
def demo(
    diagnose_tasks: int,
    diagnose_trials: int,
    eval_tasks: int,
    eval_trials: int,
    budget: int,
    max_tokens: int,
    max_capabilities: int,
    baseline: bool,
    seed: int,
    out: Path,
    ready_timeout: float,
    port_offset: int,
) -> None:
    """Run one complete cycle on toolbox with the embedded defaults, then show the report."""
    console.print(
        f"[bold]retrace demo[/]: agent {AGENT} ({DEFAULT_AGENT_MODEL} on toolbox). Budget: "
        f"diagnosis {diagnose_tasks} train tasks x {diagnose_trials}, {budget} GRPO rollouts per "
        f"adapter for at most {max_capabilities} capabilities, evaluation {eval_tasks} test "
        f"tasks x {eval_trials} per configuration, baselines {'on' if baseline else 'off'}."
    )
    # SIGTERM (a terminal closed, `kill`) must stop what the demo started, like Ctrl-C does.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    for name, value in CPU_DEFAULTS.items():
        os.environ.setdefault(name, value)  # the services `retrace up` starts inherit these
    started = time.monotonic()
    with running_up(ready_timeout, port_offset, "demo-up.log"):
        ensure_agent(AGENT, DEFAULT_AGENT_MODEL, "toolbox")
        code = _retrace(
            "improve",
            AGENT,
            "--diagnose-tasks", str(diagnose_tasks),
            "--diagnose-trials", str(diagnose_trials),
            "--eval-tasks", str(eval_tasks),
            "--eval-trials", str(eval_trials),
            "--budget", str(budget),
            "--max-tokens", str(max_tokens),
            "--max-capabilities", str(max_capabilities),
            "--baseline" if baseline else "--no-baseline",
            "--seed", str(seed),
        )  # fmt: skip
        _retrace("report", AGENT, "--out", str(out))
        console.print(
            f"demo finished in {time.monotonic() - started:.0f}s "
            f"({'cycle completed' if code == 0 else 'cycle failed: see the reason above'})"
        )


@contextlib.contextmanager
def running_up(ready_timeout: float, port_offset: int, log_name: str) -> Iterator[None]:
    """`retrace up` in the background until the block ends, healthy before it starts; its
    output goes to `<data dir>/<log_name>`. Everything it started is stopped afterwards."""
    log = Path(os.environ.get("RETRACE_STORAGE_DATA_DIR", ".retrace")) / log_name
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        up = subprocess.Popen(
            [
                sys.executable, "-m", "shared.cli.main", "up",
                "--ready-timeout", str(ready_timeout), "--port-offset", str(port_offset),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    started = time.monotonic()
    try:
        deadline = time.monotonic() + ready_timeout + 60
        while "all services healthy" not in log.read_text():
            if up.poll() is not None:
                raise click.ClickException(f"`retrace up` exited ({up.returncode}); see {log}")
            if time.monotonic() > deadline:
                raise click.ClickException(f"services did not become healthy; see {log}")
            time.sleep(2)
        console.print(f"services up in {time.monotonic() - started:.0f}s (log: {log})")
        yield
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        if up.returncode != 0:  # a clean exit stopped everything it started itself
            _retrace("down")


def ensure_agent(name: str, model: str, environment: str) -> None:
    """The default tenant's agent `name`, created on `environment` unless it exists."""
    listed = subprocess.run(
        [sys.executable, "-m", "shared.cli.main", "agent", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    if name not in listed.stdout:
        _retrace("agent", "create", name, "--model", model, "--env", environment, check=True)
