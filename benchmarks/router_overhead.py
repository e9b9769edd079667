"""Latency the router adds per request: the same chat requests sent straight to an inference
endpoint and through `retrace`'s router (auth, conversation lookup, routing, recording).

    python -m benchmarks.router_overhead --requests 300 --out docs/bench/router_overhead.json
    python -m benchmarks.router_overhead --routers 2      # two router processes, one port

The endpoint is an instant fake (it answers a fixed reply at once), so the difference is the
router's own cost. The router runs as its own processes (`python -m services.router`, one or
`--routers` sharing the port), on real Postgres (the local server) and NATS, routing over two
adapters whose profiles are a definition and six diagnosed requests each, by default with the
router's embedder (`cascade-learned`: MiniLM's static vectors where they are sure, the
learned static table elsewhere; `--embedder cascade-learned-int8` asks MiniLM's int8 graph
where the table is unsure).
Half the requests open a new conversation (routed: an alarm or a wake-up call for one adapter,
a currency conversion for the other, the weather for neither; each worded afresh), half
continue one (found in the router's memory, else by the conversation hash in the store).
`--turns 50 --follow-up-bytes 1000` gives agent-like traffic instead: conversations of 50
requests, each user turn 1 kB, so most requests carry a long history.

Then the sustained rate, side by side in the same run: a load generator in its own process
(`--concurrency` clients in a closed loop for `--duration` seconds, the same request mix;
`benchmarks.lean_http`'s client, or `--load-client aiohttp` as before session 26, which
took a fifth of the cores' time itself) against the endpoint directly, then through the
router. Afterwards the turns the router wrote are counted against those it answered, and how
each new conversation was routed; the one-at-a-time phase's added latency is also given by
how its new conversations were routed (`added_ms_by_route`: which stage decided, so what a
p99 is made of).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import func, select, text

from benchmarks.lean_http import HttpError, LeanClient
from services.router.config import RouterConfig
from shared.config import DatabaseConfig
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.migrate import upgrade_async
from shared.store.models import Adapter, Capability, Conversation, Trajectory
from shared.store.tenants import create_tenant, issue_api_key

Messages = list[dict[str, str]]
Post = Callable[[Any], Awaitable[int]]
"""Sends one prepared request; its HTTP status (0: no answer)."""

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
ALARM_FAILURES = [
    "Please add an alarm at 10:20 am called 'Yoga'.",
    "Could you set a 'Bake bread' alarm at 06:55?",
    "Set an alarm for 5:45 named 'Flight'.",
    "I need an alarm at 9 pm labelled 'Call mum'.",
    "Wake me up at 6 tomorrow morning.",
    "Add an alarm for 7:10 called 'School run'.",
]
CURRENCY_FAILURES = [
    "What's the exchange rate from JPY to CAD?",
    "How many euros is 250 dollars?",
    "Convert 80 pounds into yen.",
    "What are 1,000 Swiss francs in US dollars?",
    "Change 45 euros to pounds, please.",
    "How much is 300 CAD in euros?",
]
"""Requests each adapter's capability was diagnosed on: its routing profile, with its
definition (the benchmark's own requests are worded otherwise)."""
LABELS = ("gym", "pills", "standup", "laundry", "pick up kids", "dentist", "meds", "train")
CURRENCIES = ("US dollars", "euros", "pounds", "yen", "Swiss francs", "Canadian dollars")
PAIRS = [(a, b) for a in CURRENCIES for b in CURRENCIES if a != b]
CITIES = (
    "Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Perth", "Quebec", "Tbilisi", "Cork", "Hanoi",
    "Accra", "Bergen", "Cusco", "Dakar", "Fez", "Graz", "Hobart", "Izmir", "Jaipur", "Kyoto",
)  # fmt: skip
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")  # fmt: skip
WEEKDAYS = ("tomorrow", "on Monday", "on Tuesday", "on Wednesday", "on Thursday", "on Friday",
            "on Saturday")  # fmt: skip
LATENCY_CONVERSATIONS = 4 * 15_000
"""The latency phase's conversations are numbered from here, the load generator's below."""


def opening(n: int) -> str:
    """The first request of conversation `n`: four kinds in turn, each worded afresh, no two
    alike below 4 x 20,000 (so MiniLM's cache of seen texts never stands in for its cost)."""
    kind, k = n % 4, n // 4
    at = f"{k % 1440 // 60}:{k % 60:02d}"
    if kind == 0:
        label = LABELS[k // 1440 % len(LABELS)]
        return (
            f"Set an alarm for {at} labelled {label}.",
            f"Can you put in an alarm at {at} called '{label}'?",
            f"Alarm at {at} please, name it {label}.",
        )[k // (1440 * len(LABELS)) % 3]
    if kind == 1:
        amount, (a, b) = 5 + k % 1995, PAIRS[k // 1995 % len(PAIRS)]
        return (
            f"Convert {amount} {a} to {b}.",
            f"How much is {amount} {a} in {b}?",
            f"What do {amount} {a} come to in {b}?",
        )[k // (1995 * len(PAIRS)) % 3]
    if kind == 2:
        city, month = CITIES[k % len(CITIES)], MONTHS[k // len(CITIES) % 12]
        when = f"on {month} {1 + k // (len(CITIES) * 12) % 28}"
        return (
            f"What is the weather in {city} {when}?",
            f"Will it rain in {city} {when}?",
            f"How warm will {city} be {when}?",
        )[k // (len(CITIES) * 12 * 28) % 3]
    day = WEEKDAYS[k // 1440 % len(WEEKDAYS)]
    return (
        f"Wake me at {at} {day}.",
        f"Please wake me up at {at} {day}.",
        f"I have to be up at {at} {day}.",
    )[k // (1440 * len(WEEKDAYS)) % 3]


def conversation(n: int, turn: int, follow_up_bytes: int = 0) -> list[dict[str, str]]:
    """The messages of conversation `n`'s request number `turn` (0: it opens): each reply
    ("Done.") followed by the user's "thanks", or by a text of `follow_up_bytes` (an agent's
    tool results and long exchanges)."""
    messages = [{"role": "user", "content": opening(n)}]
    for t in range(turn):
        text = "thanks"
        if follow_up_bytes:
            filler = "all checks passed, nothing to change; "
            text = (f"Step {t}: " + filler * (follow_up_bytes // len(filler) + 1))[:follow_up_bytes]
        messages += [
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": text},
        ]
    return messages


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _setup(store: Store) -> str:
    """The tenant, its agent and two production adapters; the tenant's key."""
    async with store.cross_tenant() as session:
        await create_tenant(session, "bench")
    async with store.tenant("bench") as session:
        key = await issue_api_key(session, "bench")
        agent = await create_agent(session, "bot", model="smollm2", environment="toolbox")
        ids = []
        for skill, definition, failures in (
            ("set_alarms", "Sets an alarm at the time the user asks for.", ALARM_FAILURES),
            ("convert_currency", "Converts money between currencies.", CURRENCY_FAILURES),
        ):
            # the requests it was diagnosed on are part of its routing profile
            failed = [
                Trajectory(agent_id=agent.id, messages=[{"role": "user", "content": text}])
                for text in failures
            ]
            session.add_all(failed)
            await session.flush()
            cap = Capability(
                agent_id=agent.id,
                name=skill,
                definition=definition,
                evidence={"failed_examples": [str(t.id) for t in failed]},
            )
            session.add(cap)
            await session.flush()
            adapter = Adapter(
                agent_id=agent.id, capability_id=cap.id, name=f"bot--{skill}", base_model="smollm2"
            )
            session.add(adapter)
            await session.flush()
            ids.append(str(adapter.id))
        agent.production_adapters = ids
    return key


async def _routers(
    args: argparse.Namespace, schema: str, upstream: str
) -> list[asyncio.subprocess.Process]:
    """`args.routers` router processes on one port, each started (its embedders loaded)."""
    env = {
        **os.environ,
        "RETRACE_DATABASE_URL": args.database_url,
        "RETRACE_DATABASE_SCHEMA": schema,
        "RETRACE_DATABASE_POOL_SIZE": "5",
        "RETRACE_NATS_URL": args.nats_url,
        "RETRACE_NATS_SUBJECT_PREFIX": f"b{schema}",
        "RETRACE_NATS_STREAM_PREFIX": schema.upper(),
        "RETRACE_HTTP_PORT": str(args.port),
        "RETRACE_HTTP_REUSE_PORT": "true",
        "RETRACE_MODEL_URL": upstream,
        "RETRACE_ROUTER_MODE": args.mode,
        "RETRACE_ROUTER_EMBEDDER": args.embedder,
        "RETRACE_ROUTER_CACHE_S": str(args.cache_s),
        "RETRACE_LOG_FORMAT": "json",
    }
    procs = []
    for _ in range(args.routers):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.router", env=env, stderr=asyncio.subprocess.PIPE
        )
        assert proc.stderr is not None
        async with asyncio.timeout(120):
            while b"service started" not in (line := await proc.stderr.readline()):
                if not line:
                    raise RuntimeError(f"a router did not start (exit {await proc.wait()})")
        # later logs must not fill the pipe
        DRAINS.append(asyncio.create_task(_drain(proc, args.router_log)))
        procs.append(proc)
    return procs


DRAINS: list[asyncio.Task[None]] = []


async def _drain(proc: asyncio.subprocess.Process, into: Path | None) -> None:
    """Read a router's log to its end; its lines appended to `into` if given."""
    assert proc.stderr is not None
    lines = []
    while line := await proc.stderr.readline():
        if into is not None:
            lines.append(line)
    if into is not None:
        await asyncio.to_thread(_append, into, b"".join(lines))


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as out:
        out.write(data)


async def main(args: argparse.Namespace) -> dict[str, object]:
    async def chat(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(REPLY)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for piece in ("Do", "ne."):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

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
    try:
        key = await _setup(store)
        routers = await _routers(args, schema, f"http://127.0.0.1:{upstream.port}/v1")
        try:
            assert upstream.port is not None
            latency, each = await _latency(args, key, upstream.port)
            streaming = await _first_tokens(args, key, upstream.port)
            pids = [proc.pid for proc in routers]
            sustained = {
                "direct": await _sustained(
                    f"http://127.0.0.1:{upstream.port}/v1/chat/completions", "", args, pids
                ),
                "router": await _sustained(
                    f"http://127.0.0.1:{args.port}/v1/chat/completions", key, args, pids
                ),
            }
            answered = args.requests + args.streams + int(sustained["router"]["requests"])
            backlog = await _backlog(store, answered)
        finally:
            for proc in routers:  # a router writes every answered turn before it stops
                proc.send_signal(signal.SIGTERM)
            codes = [await proc.wait() for proc in routers]
            await asyncio.gather(*DRAINS)  # their logs read to the end
        async with store.tenant("bench") as session:
            recorded = await session.scalar(select(func.sum(Conversation.turns)))
            mode = func.coalesce(Conversation.route["mode"].astext, "-")
            routes = {
                str(m): int(n)
                for m, n in await session.execute(select(mode, func.count()).group_by(mode))
            }
            openings = [first for first, _ in each if first is not None]
            by_route = _by_route(each, await _routed_openings(session, openings))
    finally:
        await store.close()
        await upstream.close()
        await _drop(args.database_url, schema)
    return {
        **latency,
        "added_ms_by_route": by_route,
        "streaming": streaming,
        "sustained": sustained,
        "routers": args.routers,
        "router_exit_codes": codes,
        "turns_answered": answered,
        "turns_recorded": int(recorded or 0),
        **backlog,
        "new_conversations_by_route": routes,
    }


async def _latency(
    args: argparse.Namespace, key: str, upstream_port: int
) -> tuple[dict[str, object], list[tuple[str | None, float]]]:
    """`args.requests` requests one at a time, each straight to the endpoint, then through
    the router: new and continued conversations alternating. Also each request's opening
    (None: it continues a conversation) and added seconds."""
    direct: list[float] = []
    routed: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        for i in range(args.requests):
            messages = conversation(
                LATENCY_CONVERSATIONS + i // args.turns, i % args.turns, args.follow_up_bytes
            )
            body = {"model": "bot", "messages": messages}
            started = time.perf_counter()
            async with http.post(
                f"http://127.0.0.1:{upstream_port}/v1/chat/completions", json=body
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
    added = [b - a for a, b in zip(direct, routed, strict=True)]
    opened = [a for i, a in enumerate(added) if i % args.turns == 0]
    continued = [a for i, a in enumerate(added) if i % args.turns]
    # each request's opening (None: it continues one) and its added seconds
    each = [
        (opening(LATENCY_CONVERSATIONS + i // args.turns) if i % args.turns == 0 else None, a)
        for i, a in enumerate(added)
    ]
    return {
        "requests": args.requests,
        "direct_ms": {"p50": pct(direct, 0.5) * 1000, "p99": pct(direct, 0.99) * 1000},
        "router_ms": {"p50": pct(routed, 0.5) * 1000, "p99": pct(routed, 0.99) * 1000},
        "added_ms": {
            "p50": pct(added, 0.5) * 1000,
            "p99": pct(added, 0.99) * 1000,
            "mean": statistics.fmean(added) * 1000,
        },
        "new_conversation_added_ms_p50": pct(opened, 0.5) * 1000,
        # None: `--turns 1` continues no conversation
        "continued_added_ms_p50": pct(continued, 0.5) * 1000 if continued else None,
    }, each


async def _first_tokens(
    args: argparse.Namespace, key: str, upstream_port: int
) -> dict[str, float | None]:
    """Time to the first streamed chunk, straight and through the router, for `args.streams`
    streamed requests (new and continued conversations alternating)."""
    direct: list[float] = []
    routed: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    first = LATENCY_CONVERSATIONS + args.requests
    async with aiohttp.ClientSession() as http:
        for i in range(args.streams):
            messages = conversation(first + i // args.turns, i % args.turns, args.follow_up_bytes)
            body = {"model": "bot", "messages": messages, "stream": True}
            for port, times, auth in (
                (upstream_port, direct, {}),
                (args.port, routed, headers),
            ):
                started = time.perf_counter()
                async with http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=auth
                ) as r:
                    assert r.status == 200, await r.text()
                    while not (await r.content.readline()).startswith(b"data:"):
                        pass
                    times.append(time.perf_counter() - started)
                    await r.read()
    added = [b - a for a, b in zip(direct, routed, strict=True)]
    opened = [a for i, a in enumerate(added) if i % args.turns == 0]
    continued = [a for i, a in enumerate(added) if i % args.turns]
    return {
        "streams": args.streams,
        "direct_first_token_ms_p50": pct(direct, 0.5) * 1000,
        "router_first_token_ms_p50": pct(routed, 0.5) * 1000,
        "added_first_token_ms_p50": pct(added, 0.5) * 1000,
        "added_first_token_ms_p50_continued": pct(continued, 0.5) * 1000 if continued else None,
        "added_first_token_ms_p50_new": pct(opened, 0.5) * 1000,
    }


async def _routed_openings(session: Any, openings: list[str]) -> dict[str, str]:
    """Each of `openings` (the one-at-a-time phase's) -> the stage that routed its
    conversation; `mixed` where conversations opened alike were routed apart (a load phase
    long enough to reach the latency phase's numbers opens them again)."""
    rows = await session.execute(
        text(
            "SELECT t.messages -> 0 ->> 'content', coalesce(c.route ->> 'mode', '-') "
            "FROM conversations c JOIN trajectories t ON t.id = c.trajectory_id "
            "WHERE t.messages -> 0 ->> 'content' = ANY(:openings)"
        ),
        {"openings": openings},
    )
    modes: dict[str, str] = {}
    for first, mode in rows:
        modes[str(first)] = mode if modes.get(str(first), mode) == mode else "mixed"
    return modes


def _by_route(
    added: list[tuple[str | None, float]], modes: dict[str, str]
) -> dict[str, dict[str, float]]:
    """Added milliseconds of the one-at-a-time requests by how their conversation was routed
    (`continued`: a later turn, routed when it opened)."""
    groups: dict[str, list[float]] = {}
    for first, seconds in added:
        route = "continued" if first is None else modes.get(first, "not recorded")
        groups.setdefault(route, []).append(seconds * 1000)
    return {
        route: {
            "requests": len(own),
            "share": len(own) / len(added),
            "p50": pct(own, 0.5),
            "p90": pct(own, 0.9),
            "p99": pct(own, 0.99),
        }
        for route, own in sorted(groups.items())
    }


async def _recorded(store: Store) -> int:
    async with store.tenant("bench") as session:
        return int(await session.scalar(select(func.sum(Conversation.turns))) or 0)


async def _backlog(store: Store, answered: int, within: float = 60.0) -> dict[str, object]:
    """The turns not in the store yet when the load stopped, and how long the routers then
    took to write them (None: not within `within` s), before they are told to stop: a rate
    the recorder does not keep up with shows here, not hidden by the shutdown's flush."""
    started = time.perf_counter()
    waiting = answered - await _recorded(store)
    caught_up: float | None = None
    while time.perf_counter() - started < within:
        if await _recorded(store) >= answered:
            caught_up = time.perf_counter() - started
            break
        await asyncio.sleep(0.1)
    return {"turns_waiting_when_load_stopped": waiting, "recorded_all_within_s": caught_up}


async def _drop(database_url: str, schema: str) -> None:
    store = Store.connect(DatabaseConfig(url=database_url, schema=schema), database_url)
    async with store.engine.begin() as conn:
        await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    await store.close()


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user and system), from /proc; 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu(routers: list[int]) -> dict[str, float]:
    """CPU seconds so far of the routers, this process (the stand-in endpoint) and the local
    Postgres server's processes (none where it runs elsewhere)."""
    postgres = 0.0
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(b"postgres"):
                postgres += _cpu_s(int(entry.name))
    return {
        "routers": sum(_cpu_s(pid) for pid in routers),
        "endpoint": time.process_time(),
        "postgres": postgres,
    }


async def _sustained(
    url: str, key: str, args: argparse.Namespace, routers: list[int]
) -> dict[str, Any]:
    """Requests/s a separate load-generator process gets from `url`, and the CPU time each
    part spent a request meanwhile (Linux: /proc; the load generator measures its own)."""
    before = _cpu(routers)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.router_overhead", "--load-url", url,
        "--load-key", key, "--concurrency", str(args.concurrency),
        "--duration", str(args.duration), "--turns", str(args.turns),
        "--follow-up-bytes", str(args.follow_up_bytes), "--load-client", args.load_client,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode})")
    after = _cpu(routers)
    result: dict[str, Any] = json.loads(out)
    answered = max(1, int(result["requests"]))
    spent = {part: after[part] - before[part] for part in after}
    spent["load_generator"] = float(result.pop("cpu_s"))
    result["cpu_ms_per_request"] = {k: round(v * 1000 / answered, 4) for k, v in spent.items()}
    return result


async def load(
    url: str,
    key: str,
    concurrency: int,
    duration: float,
    turns: int = 2,
    follow_up_bytes: int = 0,
    client: str = "lean",
) -> dict[str, float]:
    """`concurrency` clients in a closed loop for `duration` s: each opens a conversation,
    continues it to `turns` requests, and opens the next. `client`: `lean`
    (`benchmarks.lean_http`, one keep-alive connection each, a fraction of aiohttp's CPU a
    request) or `aiohttp` (its client session, as sessions before 26 measured)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    done = failed = 0
    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def run(n: int, prepare: Callable[[Messages], Any], post: Post) -> None:
        """One client: its conversations, each request's body prepared untimed, then sent."""
        nonlocal done, failed
        i = 0
        while time.perf_counter() < deadline:
            request = prepare(
                conversation(n + concurrency * (i // turns), i % turns, follow_up_bytes)
            )
            started = time.perf_counter()
            status = await post(request)
            latencies.append(time.perf_counter() - started)
            done += status == 200
            failed += status != 200
            i += 1

    def lean_post(http: LeanClient) -> Post:
        async def post(body: bytes) -> int:
            try:
                status, _ = await http.post(body)
            except (HttpError, OSError):
                return 0
            return status

        return post

    def session_post(http: aiohttp.ClientSession) -> Post:
        async def post(payload: dict[str, Any]) -> int:
            async with http.post(url, json=payload, headers=headers) as r:  # encodes it
                await r.read()
                return r.status

        return post

    started, cpu = time.perf_counter(), time.process_time()
    if client == "lean":
        clients = [LeanClient(url, headers) for _ in range(concurrency)]
        encode = msgspec.json.encode
        await asyncio.gather(
            *(
                run(n, lambda m: encode({"model": "bot", "messages": m}), lean_post(one))
                for n, one in enumerate(clients)
            )
        )
        for one in clients:
            one.close()
    else:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(
                *(
                    run(n, lambda m: {"model": "bot", "messages": m}, session_post(session))
                    for n in range(concurrency)
                )
            )
    wall = time.perf_counter() - started
    return {
        "cpu_s": time.process_time() - cpu,
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
    parser.add_argument(
        "--streams", type=int, default=100, help="streamed requests for time to first token"
    )
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
    parser.add_argument(
        "--embedder",
        default=next(
            f.default for f in msgspec.structs.fields(RouterConfig) if f.name == "embedder"
        ),
        help="RETRACE_ROUTER_EMBEDDER (default: the router's)",
    )
    parser.add_argument("--routers", type=int, default=1, help="router processes on the port")
    parser.add_argument(
        "--turns", type=int, default=2, help="requests a conversation takes (1 opens it)"
    )
    parser.add_argument(
        "--follow-up-bytes",
        type=int,
        default=0,
        help="each user turn after the first this long (0: 'thanks'): long agent histories",
    )
    parser.add_argument("--router-log", type=Path, help="append the routers' logs to this file")
    parser.add_argument(
        "--load-client",
        choices=("lean", "aiohttp"),
        default="lean",
        help="the load generator's HTTP client: lean (benchmarks.lean_http) or aiohttp's, "
        "which sessions before 26 measured with (a third of the cores' time a request)",
    )
    parser.add_argument("--load-url", help=argparse.SUPPRESS)
    parser.add_argument("--load-key", default="", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.turns < 1 or ns.follow_up_bytes < 0:
        parser.error("--turns must be 1 or more, --follow-up-bytes 0 or more")
    if ns.load_url:  # the load-generator process
        stats = asyncio.run(
            load(
                ns.load_url,
                ns.load_key,
                ns.concurrency,
                ns.duration,
                ns.turns,
                ns.follow_up_bytes,
                ns.load_client,
            )
        )
        print(json.dumps(stats))
        sys.exit(0)
    out = asyncio.run(main(ns))
    print(json.dumps(out, indent=2))
    if ns.out:
        ns.out.write_text(
            json.dumps({"settings": {k: str(v) for k, v in vars(ns).items()}, **out}, indent=2)
        )
