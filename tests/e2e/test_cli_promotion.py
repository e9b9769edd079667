"""The whole cycle with a real model, to promotion: SmolLM2 (served by `retrace serve-model`,
trained by the train service) on a planted target where training must help (the codebook
desk behind the HTTP environment protocol: an episode succeeds only when the agent calls its
one tool). Every stage runs in the services as subprocesses over the real bus and Postgres:
diagnosis rollouts, contrast, a derived environment with simulated tools and its
calibration, GRPO on it, evaluation of base and routed adapter on the target's test split,
and the verdict. The tenant holds only an API key (issue 16's "done when"): it creates the
agent, starts the cycle and follows its events over the control API, and reads the result
in the console in a browser. Its counterpart on the reject path is `test_cli_diagnose`."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shared.cli.context import SERVICES
from shared.envs.remote.server import environment_app
from tests.e2e.test_cli_up import cli, env, running_up  # noqa: F401  (fixture)
from tests.support.browser import chromium, screenshots
from tests.support.codebook_env import CodebookEnvironment
from tests.support.models import packaged_or_skip
from tests.support.oracle_llm import serve_in_thread

pytest.importorskip("torch", reason="training needs the train extra")
# pytest-timeout's limit above the test's own 2400 s deadline (below): at 1320 s it stopped the
# test in a whole run on session 23's machine before the deadline could say what was slow
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(2520)]

TEMPERATURE = "0.7"
"""At 1.0 SmolLM2 never copied the call in 40 samples; at 0.7 it did in a third of them
(`benchmarks/codebook_grpo.py`, docs/benchmarks.md)."""
PLANTED = ("use_tools_when_needed", "well_formed_tool_calls", "valid_tool_arguments")
"""What the codebook target's failures lack: no call at all, or a call written badly."""
TOKENS = "40"
"""Enough for the call (about 30 tokens) or a one-line answer."""
SETTINGS = {
    "diagnose_tasks": 8, "diagnose_trials": 2, "eval_tasks": 8, "eval_trials": 2,
    "rollout_budget": 64, "max_tokens": int(TOKENS), "temperature": float(TEMPERATURE),
    "max_capabilities": 1, "spare_capabilities": 0, "baselines": [],
}  # fmt: skip
"""The cycle's settings, as a tenant sends them to the control API."""


def test_a_cycle_started_with_a_key_trains_an_adapter_that_is_promoted(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    packaged_or_skip("smollm2")
    env = {
        **env,
        "COLUMNS": "200",  # rich's tables, unwrapped
        # calibration: 4 tasks x 4 samples, as the demo's; the base model calls the tool in
        # about a third of its samples, inside the band
        "RETRACE_SYNTHESIZE_CALIBRATION_TASKS": "4",
        "RETRACE_SYNTHESIZE_CALIBRATION_SAMPLES": "4",
        # one regeneration: 16 samples at a third each fall under the band's 0.15 about one
        # run in twenty (0.125 in a full run beside other load, session 16), which left the
        # cycle nothing to train
        "RETRACE_SYNTHESIZE_MAX_REGENERATIONS": "1",
        "RETRACE_SYNTHESIZE_TEMPERATURE": TEMPERATURE,
        "RETRACE_SYNTHESIZE_MAX_TOKENS": TOKENS,
        "RETRACE_SYNTHESIZE_MAX_TURNS": "2",
        # GRPO: the budget of 64 is 8 steps of one group of 8; on this task group rewards
        # were mostly over 0.8 from the fourth step at 5e-4 (docs/benchmarks.md)
        "RETRACE_TRAIN_GROUP_SIZE": "8",
        "RETRACE_TRAIN_LEARNING_RATE": "5e-4",
        "RETRACE_TRAIN_TEMPERATURE": TEMPERATURE,
        "RETRACE_TRAIN_MAX_NEW_TOKENS": TOKENS,
        "RETRACE_TRAIN_MAX_TURNS": "2",
        "RETRACE_TRAIN_HELDOUT_TASKS": "0",
        "RETRACE_TRAIN_MAX_JOBS": "1",
        # two steps' groups sampled as one batch of 16, as the demo does on a CPU
        "RETRACE_TRAIN_SAMPLE_AHEAD": "1",
        # the tenant's environment server runs on this machine: the operator allows that
        # (a tenant's URL must otherwise lead to public addresses)
        "RETRACE_API_TENANT_ENVIRONMENTS_PRIVATE": "true",
    }
    with serve_in_thread(environment_app(CodebookEnvironment())) as url:
        target = url.removesuffix("/v1")
        with running_up(
            env, "rollout", "contrast", "synthesize", "train", "evaluator", "api",
            first_port=27000, model="smollm2",
        ) as offset:  # fmt: skip
            # the operator gives the tenant a key; the tenant does the rest over HTTP
            made_key = cli(env, "tenant", "key", "create", "default")
            assert made_key.returncode == 0, made_key.stderr
            api = Api(SERVICES["api"] + offset, made_key.stdout.split("shown once): ")[-1].strip())
            cycle = _improve_with_a_key(api, target)
            report = cycle["data"]["report"]
            assert report["verdict"]["promote"], report["verdict"]
            assert report["comparison"]["diff"] >= 0.3, report  # measured +0.75 to +0.875
            _read_the_cycle_in_a_browser(api, cycle["id"])
            # the operator's CLI reads the same store
            shown = cli(env, "capabilities", "coder", "--json", str(tmp_path / "caps.json"))
            assert shown.returncode == 0, shown.stderr
            kept = [c["name"] for c in json.loads((tmp_path / "caps.json").read_text())]
            assert "use_tools_when_needed" in kept, kept
            adapters = cli(env, "adapters", "coder")
            assert adapters.returncode == 0, adapters.stderr
            [row] = [line for line in adapters.stdout.splitlines() if "coder--" in line]
            # the diagnosis ranks the capabilities the planted task needs by its samples:
            # calling the tool at all, or writing the call well (seen first in one run of
            # three); training either one taught the call
            assert any(c in row for c in PLANTED), adapters.stdout
            assert "│ yes" in row, adapters.stdout  # in production


class Api:
    """The control API as a tenant reaches it: a URL and an API key."""

    def __init__(self, port: int, key: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.key = key

    def request(self, method: str, path: str, body: object = None) -> urllib.request.Request:
        return urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )

    def call(self, method: str, path: str, body: object = None) -> Any:
        with urllib.request.urlopen(self.request(method, path, body), timeout=60) as r:
            return json.loads(r.read())


def _improve_with_a_key(api: Api, target: str) -> dict[str, Any]:
    """Create the agent, start a cycle and follow its events until it ends, with the key
    alone: the cycle as its last event showed it."""
    agent = api.call("POST", "/v1/agents", {"name": "coder", "model": "smollm2",
                                             "environment": target})  # fmt: skip
    assert agent["environment"] == target and agent["production_adapters"] == []
    started = api.call("POST", "/v1/agents/coder/cycles", {"settings": SETTINGS})
    assert started["state"] == "requested", started
    states: list[str] = []
    last: dict[str, Any] = {}
    # 2400 s: alone 4m19s on session 11's machine, 10m53s beside the model tests on the
    # other worker; on session 22's, 5m22s alone and over 20 minutes in the whole run (twice
    # stopped by the old 1200 s while evaluating); a slower machine must not fail it for
    # time alone
    deadline = time.monotonic() + 2400
    events = api.request("GET", f"/v1/cycles/{started['id']}/events")
    with urllib.request.urlopen(events, timeout=60) as stream:  # a comment every 15 s at least
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                last = json.loads(line.removeprefix("data: "))
                if not states or states[-1] != last["state"]:
                    states.append(last["state"])
            assert time.monotonic() < deadline, states
    # the stream ends with the cycle; it was seen through its stages, live
    assert states[-1] == "completed", (states, last.get("error"), last.get("reason"))
    assert {"diagnosing", "training", "evaluating"} <= set(states), states
    return last


def _read_the_cycle_in_a_browser(api: Api, cycle_id: str) -> None:
    """The cycle's result as the tenant sees it in the console, in headless Chromium (over
    HTTP where Chromium is not installed): signed in with the key, the agents page, the
    cycle page (promotion, the capability it trained, the evaluation table, the training
    curve) and one of its trajectories; screenshots of this real cycle are saved where
    `RETRACE_CONSOLE_SCREENSHOTS` says (docs/console)."""
    [trajectory] = api.call("GET", "/v1/trajectories?limit=1")["data"]
    pages = {
        "agents": "/console/agents",
        "cycle": f"/console/cycles/{cycle_id}",
        "trajectory": f"/console/trajectories/{trajectory['id']}",
    }
    try:
        browser = chromium()
    except pytest.skip.Exception:
        shown = {}
        for name, path in pages.items():
            page = urllib.request.Request(
                api.base + path, headers={"Cookie": f"retrace_key={api.key}"}
            )
            with urllib.request.urlopen(page, timeout=30) as r:
                shown[name] = r.read().decode()
    else:
        shown = _browse(browser, api, pages)
    assert "coder" in shown["agents"], shown["agents"][:2000]
    cycle = shown["cycle"]
    assert "promoted" in cycle and any(c in cycle for c in PLANTED), cycle[:2000]
    for seen in ("routed", "95% CI", "mean reward per step", "McNemar p="):
        assert seen in cycle, seen
    assert "lookup_code" in shown["trajectory"], shown["trajectory"][:2000]


def _browse(browser: Any, api: Api, pages: dict[str, str]) -> dict[str, str]:
    """Each page's text as Chromium renders it, signed in through the sign-in form."""
    from selenium.webdriver.common.by import By

    shots = screenshots()
    shown = {}
    try:
        browser.get(f"{api.base}/console/")
        field = browser.find_element(By.NAME, "key")
        field.send_keys(api.key)
        field.submit()
        for name, path in pages.items():
            browser.get(api.base + path)
            shown[name] = browser.find_element(By.TAG_NAME, "main").text
            assert "error" not in browser.title.lower(), (name, browser.title)
            if shots is not None:
                shots.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(str(shots / f"real-{name}.png"))
    finally:
        browser.quit()
    return shown
