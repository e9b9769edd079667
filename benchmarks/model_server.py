"""`retrace serve-model` as a subprocess for benchmarks: start it, wait until it answers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp


def spawn(port: int, threads: int, max_batch: int = 32) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shared.cli.main",
            "serve-model",
            "--port",
            str(port),
            "--threads",
            str(threads),
            "--max-batch",
            str(max_batch),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )


async def wait_up(url: str, proc: subprocess.Popen[bytes], limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("serve-model exited")
        try:
            async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1)
    raise SystemExit("serve-model did not come up")
