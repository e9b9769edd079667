"""Latency the router adds per request: the same chat requests sent straight to an inference
endpoint and through `retrace`'s router (auth, conversation lookup, routing, recording).

    python -m benchmarks.router_overhead --requests 300 --out docs/bench/router_overhead.json

The endpoint is an instant fake (it answers a fixed reply at once), so the difference is the
router's own cost: real Postgres (the local server, or embedded) and real NATS, embedding
routing with all-MiniLM-L6-v2 over two adapters. Half the requests open a new conversation
(routed), half continue one (looked up by the conversation hash).

Then the sustained rate, side by side in the same run: a load generator in its own process
(`--concurrency` clients in a closed loop for `--duration` seconds, the same request mix)
against the endpoint directly, then through the router.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web
from sqlalchemy import func, select
from aiohttp.test_utils import TestServer

from services.router.config import RouterConfig
from services.router.service import build
from shared.config import DatabaseConfig, HttpConfig, ModelConfig, NatsConfig
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.migrate import upgrade_async
from shared.store.models import Adapter, Capability, Conversation
from shared.store.tenants import create_tenant, issue_api_key

REPLY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
REQUESTS = [
    "Set an alarm for 6:30 labelled gym.",
    "Convert 120 US dollars to euros.",
    "What is the weather in Lisbon?",
    "Wake me at 7 tomorrow.",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    async def chat(_: web.Request) -> web.Response:
        return web.json_response(REPLY)

    async def models(_: web.Request) -> web.Response:
        # every adapter is loaded: the router's reload check passes without reloading
        names = ["smollm2", "bot--set_alarms", "bot--convert_currency"]
        return web.json_response({"object": "list", "data": [{"id": n} for n in names]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    upstream = TestServer(app)
    await upstream.start_server()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    await upgrade_async(args.database_url, schema)
    db = DatabaseConfig(url=args.database_url, schema=schema, pool_size=5)
    store = Store.connect(db, args.database_url)
    async with store.cross_tenant() as session:
        await create_tenant(session, "bench")
    async with store.tenant("bench") as session:
        key = await issue_api_key(session, "bench")
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        ids = []
        for skill, definition in (
            ("set_alarms", "Sets an alarm at the time the user asks for."),
            ("convert_currency", "Converts money between currencies."),
        ):
            cap = Capability(agent_id=agent.id, name=skill, definition=definition)
            session.add(cap)
            await session.flush()
            adapter = Adapter(
                agent_id=agent.id, capability_id=cap.id, name=f"bot--{skill}", base_model="smollm2"
            )
            session.add(adapter)
            await session.flush()
            ids.append(str(adapter.id))
        agent.production_adapters = ids
    await store.close()
    cfg = RouterConfig(
        nats=NatsConfig(
            url=args.nats_url, subject_prefix=f"b{schema}", stream_prefix=schema.upper()
        ),
        database=db,
        http=HttpConfig(port=args.port),
        model=ModelConfig(url=f"http://127.0.0.1:{upstream.port}/v1"),
        cache_s=args.cache_s,
        mode=args.mode,
        embedder=args.embedder,
    )
    service = build(cfg)
    run = asyncio.create_task(service.run())
    for _ in range(300):  # up to 30 s for the service to become healthy
        if (await service.health()).status == "ok":
            break
        await asyncio.sleep(0.1)
    direct: list[float] = []
    last: list[dict[str, str]] = []
    routed: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        # warm-up: the embedding model loads on first use
        await http.post(
            f"http://127.0.0.1:{args.port}/v1/chat/completions",
            json={"model": "bot", "messages": [{"role": "user", "content": "warm up"}]},
            headers=headers,
        )
        for i in range(args.requests):
            text = f"{REQUESTS[i % len(REQUESTS)]} (#{i // 2})"
            messages = [{"role": "user", "content": text}]
            if i % 2:  # continue the previous conversation
                messages = [
                    *last,
                    {"role": "assistant", "content": "Done."},
                    {"role": "user", "content": "thanks"},
                ]
            body = {"model": "bot", "messages": messages}
            started = time.perf_counter()
            async with http.post(
                f"http://127.0.0.1:{upstream.port}/v1/chat/completions", json=body
            ) as r:
                await r.read()
            direct.append(time.perf_counter() - started)
            started = time.perf_counter()
            async with http.post(
                f"http://127.0.0.1:{args.port}/v1/chat/completions", json=body, headers=headers
            ) as r:
                await r.read()
                assert r.status == 200, await r.text()
            routed.append(time.perf_counter() - started)
            last = [{"role": "user", "content": text}]
    sustained = {
        "direct": await _sustained(
            f"http://127.0.0.1:{upstream.port}/v1/chat/completions", "", args
        ),
        "router": await _sustained(f"http://127.0.0.1:{args.port}/v1/chat/completions", key, args),
    }
    service.stop()
    await run  # the router writes every answered turn before it stops
    await upstream.close()
    store = Store.connect(db, args.database_url)
    async with store.tenant("bench") as session:
        recorded = await session.scalar(select(func.sum(Conversation.turns)))
    await store.close()
    answered = 1 + args.requests + int(sustained["router"]["requests"])
    added = [b - a for a, b in zip(direct, routed, strict=True)]
    result = {
        "requests": args.requests,
        "direct_ms": {"p50": pct(direct, 0.5) * 1000, "p99": pct(direct, 0.99) * 1000},
        "router_ms": {"p50": pct(routed, 0.5) * 1000, "p99": pct(routed, 0.99) * 1000},
        "added_ms": {
            "p50": pct(added, 0.5) * 1000,
            "p99": pct(added, 0.99) * 1000,
            "mean": statistics.fmean(added) * 1000,
        },
        "new_conversation_added_ms_p50": pct(added[0::2], 0.5) * 1000,
        "continued_added_ms_p50": pct(added[1::2], 0.5) * 1000,
        "sustained": sustained,
        "turns_answered": answered,
        "turns_recorded": int(recorded or 0),
    }
    return result


async def _sustained(url: str, key: str, args: argparse.Namespace) -> dict[str, float]:
    """Requests/s a separate load-generator process gets from `url`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.router_overhead", "--load-url", url,
        "--load-key", key, "--concurrency", str(args.concurrency),
        "--duration", str(args.duration),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode})")
    result: dict[str, float] = json.loads(out)
    return result


async def load(url: str, key: str, concurrency: int, duration: float) -> dict[str, float]:
    """`concurrency` clients in a closed loop for `duration` s: new and continued
    conversations alternating, as in the latency phase."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    done = failed = 0
    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def client(n: int, http: aiohttp.ClientSession) -> None:
        nonlocal done, failed
        i = 0
        while time.perf_counter() < deadline:
            opened = i - i % 2  # an odd request continues the conversation the even one opened
            messages = [
                {"role": "user", "content": f"{REQUESTS[opened % len(REQUESTS)]} ({n}/{opened})"}
            ]
            if i % 2:
                messages += [
                    {"role": "assistant", "content": "Done."},
                    {"role": "user", "content": "thanks"},
                ]
            started = time.perf_counter()
            async with http.post(
                url, json={"model": "bot", "messages": messages}, headers=headers
            ) as r:
                await r.read()
                ok = r.status == 200
            latencies.append(time.perf_counter() - started)
            done += ok
            failed += not ok
            i += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(client(n, http) for n in range(concurrency)))
    wall = time.perf_counter() - started
    return {
        "requests": done,
        "failed": failed,
        "wall_s": wall,
        "requests_per_s": done / wall,
        "p50_ms": pct(latencies, 0.5) * 1000,
        "p99_ms": pct(latencies, 0.99) * 1000,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--cache-s",
        type=float,
        default=next(
            f.default for f in msgspec.structs.fields(RouterConfig) if f.name == "cache_s"
        ),
        help="the router's RETRACE_ROUTER_CACHE_S (0: read the store on every request)",
    )
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument(
        "--mode", default="embedding", help="the router's RETRACE_ROUTER_MODE (base: no routing)"
    )
    parser.add_argument("--embedder", default="minilm", help="RETRACE_ROUTER_EMBEDDER")
    parser.add_argument("--load-url", help=argparse.SUPPRESS)
    parser.add_argument("--load-key", default="", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.load_url:  # the load-generator process
        stats = asyncio.run(load(ns.load_url, ns.load_key, ns.concurrency, ns.duration))
        print(json.dumps(stats))
        sys.exit(0)
    out = asyncio.run(main(ns))
    print(json.dumps(out, indent=2))
    if ns.out:
        ns.out.write_text(
            json.dumps({"settings": {k: str(v) for k, v in vars(ns).items()}, **out}, indent=2)
        )
