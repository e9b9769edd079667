"""What the router's way to the model server costs: a pass-through proxy (an aiohttp server
whose one handler forwards the body and returns the reply) with aiohttp's client, and with
the router's own pool (`services/router/upstream.py`), before the same stand-in endpoint.

    python -m benchmarks.relay_client --rounds 2 --out docs/bench/relay_client.json

Each round, for each client: the proxy's CPU time a request while the router benchmark's
load generator (its own process, 16 clients, closed loop) drives it for `--duration` s, and
the latency it adds to one request at a time (`--requests` each, straight and through).
Nothing else of the router runs: this is the floor its relaying sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks.router_overhead import REPLY, _cpu_s, pct

CLIENTS = ("aiohttp", "upstream")


async def proxy(client: str, upstream: str, port: int) -> None:
    """The proxy process: forwards POST /v1/chat/completions to `upstream` with `client`."""
    if client == "aiohttp":
        session = aiohttp.ClientSession()

        async def forward(body: bytes) -> tuple[int, bytes]:
            headers = {"Content-Type": "application/json", "Authorization": "Bearer key"}
            async with session.post(
                f"{upstream}/chat/completions", data=body, headers=headers
            ) as r:
                return r.status, await r.read()
    else:
        from services.router.upstream import Upstream

        pool = Upstream(upstream, headers={"Authorization": "Bearer key"}, timeout=600)

        async def forward(body: bytes) -> tuple[int, bytes]:
            return await pool.post("/chat/completions", body)

    async def chat(request: web.Request) -> web.Response:
        status, payload = await forward(await request.read())
        return web.Response(body=payload, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def _one_at_a_time(url: str, requests: int) -> list[float]:
    body = {"model": "bot", "messages": [{"role": "user", "content": "Wake me at 7, please."}]}
    latencies = []
    async with aiohttp.ClientSession() as http:
        for _ in range(requests):
            started = time.perf_counter()
            async with http.post(url, json=body) as r:
                await r.read()
            latencies.append(time.perf_counter() - started)
    return latencies


async def measure(client: str, endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.relay_client", "--serve", client,
        "--upstream", endpoint, "--port", str(args.port), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            if b"ready" not in await proc.stdout.readline():
                raise RuntimeError(f"the {client} proxy did not start")
        url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
        direct = await _one_at_a_time(f"{endpoint}/chat/completions", args.requests)
        through = await _one_at_a_time(url, args.requests)
        cpu = _cpu_s(proc.pid)
        loader = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.router_overhead", "--load-url", url,
            "--concurrency", "16", "--duration", str(args.duration),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await loader.communicate()
        load: dict[str, Any] = json.loads(out)
        cpu = _cpu_s(proc.pid) - cpu
    finally:
        proc.kill()
        await proc.wait()
    return {
        "client": client,
        "direct_p50_ms": pct(direct, 0.5) * 1000,
        "added_p50_ms": (pct(through, 0.5) - pct(direct, 0.5)) * 1000,
        "added_p99_ms": (pct(through, 0.99) - pct(direct, 0.99)) * 1000,
        "requests_per_s": load["requests_per_s"],
        "failed": load["failed"],
        "proxy_cpu_ms_per_request": cpu * 1000 / max(1, load["requests"]),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(REPLY)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    endpoint = TestServer(app)
    await endpoint.start_server()
    results = []
    try:
        for n in range(args.rounds):
            for client in CLIENTS:
                result = {
                    "round": n + 1,
                    **await measure(client, str(endpoint.make_url("/v1")), args),
                }
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
    finally:
        await endpoint.close()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1000, help="one at a time, each way")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load")
    parser.add_argument("--port", type=int, default=18099)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.serve:
        asyncio.run(proxy(ns.serve, ns.upstream, ns.port))
        sys.exit(0)
    found = asyncio.run(main(ns))
    print(json.dumps(found, indent=2))
    if ns.out:
        ns.out.write_text(
            json.dumps(
                {"settings": {k: str(v) for k, v in vars(ns).items()}, "runs": found}, indent=2
            )
        )
