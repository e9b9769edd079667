"""Latency the router adds per request: the same chat requests sent straight to an inference
endpoint and through `retrace`'s router (auth, conversation lookup, routing, recording).

    python -m benchmarks.router_overhead --requests 300 --out docs/bench/router_overhead.json

The endpoint is an instant fake (it answers a fixed reply at once), so the difference is the
router's own cost: real Postgres (the local server, or embedded) and real NATS, embedding
routing with all-MiniLM-L6-v2 over two adapters. Half the requests open a new conversation
(routed), half continue one (looked up by the conversation hash).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.router.config import RouterConfig
from services.router.service import build
from shared.config import DatabaseConfig, HttpConfig, ModelConfig, NatsConfig
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.migrate import upgrade_async
from shared.store.models import Adapter, Capability
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

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
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
    service.stop()
    await run
    await upstream.close()
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
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    out = asyncio.run(main(ns))
    print(json.dumps(out, indent=2))
    if ns.out:
        ns.out.write_text(
            json.dumps({"settings": {k: str(v) for k, v in vars(ns).items()}, **out}, indent=2)
        )
