"""`retrace up`: run services as child processes, restart the ones that die, stop them together."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from shared.logging import get_logger
from shared.serving.packaged import DEFAULT_AGENT_MODEL

log = get_logger(__name__)

RESTART_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)
MAX_RESTARTS = 5
"""Restarts within RESTART_WINDOW before a service is given up on."""
RESTART_WINDOW = 300.0
STOP_GRACE = 40.0
HEALTH_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


@dataclass
class Child:
    name: str
    port: int
    log_path: Path
    argv: list[str]
    proc: asyncio.subprocess.Process | None = None
    restarts: list[float] = field(default_factory=list)
    failed: bool = False


class Supervisor:
    def __init__(
        self,
        services: Mapping[str, int],
        env: Mapping[str, str],
        log_dir: Path,
        host: str = "127.0.0.1",
        model: str | None = None,
    ) -> None:
        self.children = [
            Child(name, port, log_dir / f"{name}.log", command(name, port, host, model))
            for name, port in services.items()
        ]
        self.env = dict(env)
        self.host = host
        self.stopping = asyncio.Event()
        log_dir.mkdir(parents=True, exist_ok=True)

    async def _spawn(self, child: Child) -> None:
        env = {**self.env, "RETRACE_HTTP_PORT": str(child.port), "RETRACE_HTTP_HOST": self.host}
        with child.log_path.open("ab") as out:
            child.proc = await asyncio.create_subprocess_exec(
                *child.argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
            )
        log.info("service spawned", service=child.name, pid=child.proc.pid, port=child.port)

    async def _watch(self, child: Child) -> None:
        while not self.stopping.is_set():
            await self._spawn(child)
            assert child.proc is not None
            if self.stopping.is_set():
                # Spawned while `stop` was signalling the others: it must stop too.
                child.proc.send_signal(signal.SIGTERM)
            code = await child.proc.wait()
            if self.stopping.is_set():
                return
            now = time.monotonic()
            child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW] + [now]
            if len(child.restarts) > MAX_RESTARTS:
                child.failed = True
                log.error(
                    "service keeps dying; giving up",
                    service=child.name,
                    exit_code=code,
                    log=str(child.log_path),
                )
                return
            pause = RESTART_BACKOFF[min(len(child.restarts), len(RESTART_BACKOFF)) - 1]
            log.warning(
                "service exited; restarting",
                service=child.name,
                exit_code=code,
                pause=pause,
                log=str(child.log_path),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), pause)

    async def healthy(self, session: aiohttp.ClientSession) -> dict[str, bool]:
        out = {}
        for child in self.children:
            try:
                async with session.get(
                    f"http://127.0.0.1:{child.port}/healthz", timeout=HEALTH_TIMEOUT
                ) as r:
                    out[child.name] = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                out[child.name] = False
        return out

    async def wait_healthy(self, limit_s: float) -> dict[str, bool]:
        deadline = time.monotonic() + limit_s
        async with aiohttp.ClientSession() as session:
            while True:
                status = await self.healthy(session)
                if all(status.values()) or time.monotonic() > deadline or self.stopping.is_set():
                    return status
                if any(c.failed for c in self.children):
                    return status
                await asyncio.sleep(0.5)

    async def run(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._watch(c), name=f"watch-{c.name}") for c in self.children]

    async def stop(self, watchers: list[asyncio.Task[None]]) -> None:
        self.stopping.set()
        live = [c.proc for c in self.children if c.proc is not None and c.proc.returncode is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), STOP_GRACE)
        except TimeoutError:
            for proc in live:
                if proc.returncode is None:
                    log.warning("service did not stop in time; killing", pid=proc.pid)
                    proc.kill()
            await asyncio.gather(*(p.wait() for p in live))
        await asyncio.gather(*watchers, return_exceptions=True)


MODEL = "model"
"""The child that serves the model (`retrace serve-model`) when `retrace up` starts one."""
MODEL_PORT = 8000


def command(name: str, port: int, host: str, model: str | None = None) -> list[str]:
    if name == MODEL:
        return [
            sys.executable,
            "-m",
            "shared.cli.main",
            "serve-model",
            "--model",
            model or DEFAULT_AGENT_MODEL,
            "--served-name",
            model or DEFAULT_AGENT_MODEL,
            "--host",
            host,
            "--port",
            str(port),
        ]
    return [sys.executable, "-m", f"services.{name}"]


def child_env(
    nats_url: str, database_url: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["RETRACE_NATS_URL"] = nats_url
    env["RETRACE_DATABASE_URL"] = database_url
    env.setdefault("RETRACE_LOG_FORMAT", "json")
    return env
