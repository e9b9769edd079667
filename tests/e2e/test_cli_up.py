"""The real CLI on the embedded defaults: `retrace up` starts all seven services, `retrace status`
reports them healthy, and the control-plane commands work against them."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.cli.context import SERVICES
from shared.cli.supervisor import MODEL, MODEL_PORT
from shared.serving.model_files import resolve_model
from shared.serving.packaged import DEFAULT_AGENT_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
_SCRIPT = Path(sys.executable).parent / "retrace"
RETRACE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "shared.cli.main"]
"""The installed console script, as a user runs it."""


class _Said:
    """A process's output read as it comes, its last 200 lines kept: a pipe nobody reads
    stops the process once 64 kB of its logs wait in it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: deque[str] = deque(maxlen=200)
        self._reader = threading.Thread(
            target=self.lines.extend, args=(proc.stdout or (),), daemon=True
        )
        self._reader.start()

    def text(self) -> str:
        """What it said so far (all of it, once it has exited)."""
        self._reader.join(timeout=10)
        return "".join(self.lines)


def _stop(up: subprocess.Popen[str]) -> None:
    """`retrace up` told to stop (it stops what it started), killed if it has not in 90 s."""
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(timeout=30)
            raise


def free_offset(first: int) -> int:
    """A port offset from `first` on whose ports nothing is bound, among this xdist worker's
    own. Offsets are multiples of 37 (no two services' ports are 37, 74 or 111 apart, so two
    offsets' ports never meet), and worker k of n takes those whose multiple is k modulo n:
    two tests starting at once on two workers never pick the same ports (they did: a test
    then talked to the other's services, "unknown or revoked API key", or its `up` could not
    bind them). Every port stays under the kernel's ephemeral range: a port in it can be the
    local end of any outgoing connection by the time `up` binds it (contrast's port was, in
    session 26's CI run, and `up` gave up on it). Past the top of the room under that range
    the search goes on from the bottom."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    top = (ephemeral_start() - max(*SERVICES.values(), MODEL_PORT)) // 37  # offsets 37 * k below
    start = max(1, -(-first // 37) % top)
    steps = [*range(start, top), *range(1, start)]
    return next(37 * k for k in steps if k % workers == worker and _ports_free(37 * k))


def ephemeral_start() -> int:
    """The first port of the kernel's range for outgoing connections' local ends (Linux's
    default where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def converted_first(model: str) -> None:
    """The model `up` will serve, converted before a test's health clock starts (minutes on
    a fresh machine), where `up` itself would convert it (transformers installed)."""
    if importlib.util.find_spec("transformers") is not None:
        resolve_model(model)


def _ports_free(offset: int) -> bool:
    """Whether each of the services' ports plus `offset` can be bound as `up` binds it (a
    listener or a connection's local end on it says no)."""
    for port in [*SERVICES.values(), MODEL_PORT]:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port + offset))
            except OSError:
                return False
    return True


def test_free_offsets_stay_under_the_ephemeral_range_and_skip_bound_ports() -> None:
    """Contrast could not bind its port in a CI run: the offset put it among the ports the
    kernel gives outgoing connections, and one took it."""
    ports = [*SERVICES.values(), MODEL_PORT]
    for first in (20_000, 24_000, 25_000, 26_000, 27_000, 28_000, 40_000):
        offset = free_offset(first)
        assert max(ports) + offset < ephemeral_start()
    taken = free_offset(27_000)
    with socket.socket() as held:  # an outgoing connection's local end, as it were
        held.bind(("127.0.0.1", min(ports) + taken))
        moved = free_offset(27_000)
    assert moved != taken and _ports_free(moved)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    clean["RETRACE_STORAGE_DATA_DIR"] = str(tmp_path / "data")
    yield clean
    subprocess.run([*RETRACE, "down"], env=clean, capture_output=True, timeout=60, check=False)


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RETRACE, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_up_prepares_its_model_before_anything_starts(env: dict[str, str], tmp_path: Path) -> None:
    """`up` readies the model it serves first (a packaged one converted then, minutes on a
    fresh machine, so that wait is not counted against --ready-timeout: a fresh machine's
    `up` gave up on its model server while it was converting). A model it cannot find is
    one clear line at once, before NATS or Postgres start, not a server never healthy."""
    pytest.importorskip("transformers")
    result = cli(env, "up", "--model", "no-such-model", timeout=60)
    assert result.returncode == 1 and "unknown model 'no-such-model'" in result.stderr
    assert "Traceback" not in result.stderr
    data = tmp_path / "data"
    assert not (data / "nats").exists() and not (data / "postgres").exists()


def test_up_then_status_then_control_plane(env: dict[str, str], tmp_path: Path) -> None:
    converted_first(DEFAULT_AGENT_MODEL)
    offset = free_offset(20_000)
    up = subprocess.Popen(
        [*RETRACE, "up", "--port-offset", str(offset)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said = _Said(up)
    try:
        deadline = time.monotonic() + 180
        report: dict = {}
        while time.monotonic() < deadline:
            assert up.poll() is None, said.text()
            result = cli(env, "status", "--json")
            if result.stdout.strip():
                report = json.loads(result.stdout)
                if result.returncode == 0:
                    break
            time.sleep(1)
        else:
            pytest.fail(f"services never became healthy: {report}")
        assert report["running"] is True
        expected = dict(SERVICES)
        if importlib.util.find_spec("torch") is not None:
            expected[MODEL] = MODEL_PORT  # `up` serves SmolLM2 itself when no endpoint is set
        assert {s["name"]: s["status"] for s in report["services"]} == dict.fromkeys(expected, "ok")
        assert {s["name"]: s["port"] for s in report["services"]} == {
            n: p + offset for n, p in expected.items()
        }
        assert report["dead_letters"] == 0 and report["errors"] == []

        human = cli(env, "status")
        assert human.returncode == 0 and "router" in human.stdout

        created = cli(env, "tenant", "create", "acme", "--name", "Acme")
        assert created.returncode == 0, created.stderr
        assert "API key (shown once): rt_acme_" in created.stdout
        prompt = tmp_path / "prompt.txt"
        prompt.write_text("You are a helpful assistant.")
        made = cli(
            env,
            "agent",
            "create",
            "support-bot",
            "--tenant",
            "acme",
            "--model",
            "smollm2",
            "--env",
            "toolbox",
            "--prompt",
            str(prompt),
        )
        assert made.returncode == 0, made.stderr
        listed = cli(env, "agent", "list", "--tenant", "acme")
        assert "support-bot" in listed.stdout
        other = cli(env, "agent", "list", "--tenant", "default")
        assert "support-bot" not in other.stdout

        # Bad input: one clear line, a non-zero exit, no traceback.
        for args, needle in [
            (("tenant", "create", "Bad_Tenant"), "invalid tenant id"),
            (("tenant", "create", "acme"), "already exists"),
            (
                (
                    "agent",
                    "create",
                    "Bad Name",
                    "--tenant",
                    "acme",
                    "--model",
                    "m",
                    "--env",
                    "toolbox",
                ),
                "invalid agent name",
            ),
            (
                (
                    "agent",
                    "create",
                    "bot",
                    "--tenant",
                    "acme",
                    "--model",
                    "m",
                    "--env",
                    "no-such-env",
                ),
                "unknown environment 'no-such-env'",
            ),
            (
                (
                    "agent",
                    "create",
                    "support-bot",
                    "--tenant",
                    "acme",
                    "--model",
                    "m",
                    "--env",
                    "toolbox",
                ),
                "already exists",
            ),
        ]:
            bad = cli(env, *args)
            assert bad.returncode == 1 and needle in bad.stderr, (args, bad.stderr)
            assert "Traceback" not in bad.stderr

        second = cli(env, "up", "--port-offset", str(offset))
        assert second.returncode != 0 and "already running" in second.stderr

        # keys: another one, listed by prefix, rotated (the old one revoked), revoked
        made_key = cli(env, "tenant", "key", "create", "acme", "--name", "ci")
        assert made_key.returncode == 0 and "rt_acme_" in made_key.stdout, made_key.stderr
        ci_key = made_key.stdout.split("API key (shown once): ")[1].split()[0]
        app_key = cli(env, "tenant", "key", "create", "acme", "--name", "app", "--scope",
                      "inference")  # fmt: skip
        assert app_key.returncode == 0 and "scope inference: the router only" in app_key.stdout
        listed_keys = cli(env, "tenant", "key", "list", "acme")
        assert ci_key[:16] in listed_keys.stdout and "ci" in listed_keys.stdout
        assert "inference" in listed_keys.stdout, listed_keys.stdout
        app_rotated = cli(env, "tenant", "key", "rotate", "acme", app_key.stdout.split(
            "API key (shown once): ")[1].split()[0])  # fmt: skip
        assert app_rotated.returncode == 0, app_rotated.stderr
        listed_again = cli(env, "tenant", "key", "list", "acme").stdout
        assert listed_again.count("inference") == 2, listed_again  # the new key kept it
        rotated = cli(env, "tenant", "key", "rotate", "acme", ci_key[:16])
        assert rotated.returncode == 0 and "new API key (shown once): rt_acme_" in rotated.stdout
        new_key = rotated.stdout.split("new API key (shown once): ")[1].split()[0]
        again = cli(env, "tenant", "key", "revoke", "acme", ci_key[:16])
        assert again.returncode == 1 and "no live key" in again.stderr
        assert cli(env, "tenant", "key", "revoke", "acme", new_key[:16]).returncode == 0
        assert "Traceback" not in again.stderr

        if MODEL in expected:
            # the model server `up` started takes requests only with the key `up` gave it and
            # every service: a chat through the router is answered, a direct one refused
            key = created.stdout.split("API key (shown once): ")[1].split()[0]
            served = cli(
                env, "agent", "create", "qwen-bot", "--tenant", "acme", "--model",
                DEFAULT_AGENT_MODEL, "--env", "toolbox",
            )  # fmt: skip
            assert served.returncode == 0, served.stderr
            body = {
                "model": "qwen-bot",
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 2,
            }
            router = f"http://127.0.0.1:{SERVICES['router'] + offset}/v1/chat/completions"
            status, answer = _post(router, body, key)
            assert status == 200 and answer["choices"], answer
            model = f"http://127.0.0.1:{MODEL_PORT + offset}/v1/chat/completions"
            status, refused = _post(model, {**body, "model": DEFAULT_AGENT_MODEL}, None)
            assert status == 401 and refused["error"]["code"] == 401, refused
    finally:
        _stop(up)
    assert up.returncode == 0, said.text()[-3000:]
    after = cli(env, "status", "--json")
    assert after.returncode == 1
    assert json.loads(after.stdout)["running"] is False


def _post(url: str, body: dict[str, object], key: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextmanager
def running_up(
    env: dict[str, str], *only: str, first_port: int, model: str | None = None
) -> Iterator[int]:
    """`retrace up --only ...` on free ports (and `--model` when given), healthy before the
    body runs, stopped after; yields the port offset (a service's port is its default plus
    it)."""
    if model != "none":
        converted_first(model or DEFAULT_AGENT_MODEL)
    offset = free_offset(first_port)
    flags = [arg for name in only for arg in ("--only", name)]
    flags += ["--model", model] if model else []
    up = subprocess.Popen(
        [*RETRACE, "up", *flags, "--port-offset", str(offset)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said = _Said(up)
    try:
        deadline = time.monotonic() + 120
        while cli(env, "status").returncode != 0:
            if up.poll() is not None or time.monotonic() > deadline:
                _stop(up)  # SIGTERM: `up` stops the services it started
                pytest.fail(
                    f"retrace up {' '.join(flags)} not healthy in 120 s (exit {up.returncode}); "
                    f"it said:\n{said.text()}"
                )
            time.sleep(1)
        yield offset
    finally:
        _stop(up)
