"""The router as a process under load while what it depends on fails for real (issue 14's
fault cases): its own Postgres stopped and started again, its NATS killed, its upstream
gone, SIGTERM in the middle of requests, SIGTERM while the store is down. Each run counts
the turns the clients were answered and the turns the store holds afterwards: every answered
turn is recorded (0 lost), every refused request is a 503 or 502 in the OpenAI error shape.

Postgres and NATS here are private ones (an embedded Postgres and a nats-server in the
test's directory), so stopping them touches nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from sqlalchemy import func, select

from shared.config import DatabaseConfig
from shared.embedded import ensure_postgres, nats_binary, stop_postgres
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.migrate import upgrade_async
from shared.store.models import Conversation, Trajectory
from shared.store.tenants import create_tenant, issue_api_key
from tests.integration.test_delivery import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCHEMA = "faults"
REPLY = {
    "id": "x",
    "object": "chat.completion",
    "model": "smollm2",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstream:
    """A fake inference endpoint on a fixed port, so it can go away and come back."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.delay = 0.05
        self._runner: web.AppRunner | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(self.delay)
        return web.json_response(REPLY)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "smollm2"}]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class Nats:
    """A nats-server of the test's own, on a fixed port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = ["-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.root)]
        self.proc = subprocess.Popen(
            [nats_binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@dataclass
class Site:
    """The private servers, the tenant's key, and the routers started."""

    root: Path
    database_url: str
    nats: Nats
    upstream: Upstream
    key: str
    routers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_router(self, **env: str) -> tuple[subprocess.Popen[bytes], str]:
        port = _free_port()
        log = (self.root / f"router-{len(self.routers)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.router"],
            env={
                **os.environ,
                "RETRACE_DATABASE_URL": self.database_url,
                "RETRACE_DATABASE_SCHEMA": SCHEMA,
                "RETRACE_NATS_URL": self.nats.url,
                "RETRACE_HTTP_PORT": str(port),
                "RETRACE_MODEL_URL": f"http://127.0.0.1:{self.upstream.port}/v1",
                "RETRACE_ROUTER_MODE": "base",
                "RETRACE_STORAGE_DATA_DIR": str(self.root / "data"),
                "RETRACE_LOG_FORMAT": "json",
                "RETRACE_CONSUMER_SHUTDOWN_GRACE": "3",
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.routers.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    @property
    def spool(self) -> Path:
        """The routers' spool (under their data directory)."""
        return self.root / "data" / "spool" / "router"

    def without_user_content(self) -> None:
        """No router log line carries what the users wrote (issue 14: error logs held whole
        user messages); the routers log at info, where user content never goes."""
        for path in self.root.glob("router-*.log"):
            text = path.read_text(errors="replace")
            assert "conversation 1: hello" not in text and "turn 1" not in text, path

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-4000:] for p in sorted(self.root.glob("router-*.log"))
        )


async def _ready(proc: subprocess.Popen[bytes], url: str, site: Site) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the router exited {proc.returncode}:\n{site.logs()}"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/healthz") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise AssertionError(f"the router did not start:\n{site.logs()}")


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    root = tmp_path
    database_url = await asyncio.to_thread(ensure_postgres, root)
    nats = Nats(root / "nats")
    nats.start()
    upstream = Upstream()
    await upstream.start()
    await upgrade_async(database_url, SCHEMA)
    store = Store.connect(DatabaseConfig(schema=SCHEMA, pool_size=2), database_url)
    try:
        async with store.cross_tenant() as session:
            await create_tenant(session, "acme")
        async with store.tenant("acme") as session:
            key = await issue_api_key(session, "acme")
            await create_agent(session, "bot", model="smollm2", environment="toolbox")
    finally:
        await store.close()
    made = Site(root, database_url, nats, upstream, key)
    try:
        yield made
    finally:
        for proc in made.routers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await upstream.stop()
        nats.kill()
        await asyncio.to_thread(stop_postgres, root)


@dataclass
class Tally:
    """What the clients saw."""

    answered: int = 0
    """Turns answered with a 200."""
    conversations: set[str] = field(default_factory=set)
    """Conversations with at least one answered turn."""
    refused: Counter[int] = field(default_factory=Counter)
    """Refusals by status (each checked for the OpenAI error shape)."""
    unreachable: int = 0
    """Requests the router did not take (connection refused or closed before a reply)."""
    in_flight_at: dict[int, float] = field(default_factory=dict)
    finished: list[tuple[float, float, int]] = field(default_factory=list)
    """(started, ended, status) of every request that got a response."""
    dropped: list[tuple[float, float]] = field(default_factory=list)
    """(started, ended) of every request that got none (`unreachable`)."""


def _check_refusal(status: int, headers: Any, body: str) -> None:
    assert status in (502, 503), (status, body)
    error = json.loads(body)["error"]
    assert error["message"] and error["type"] and error["code"] == status, body
    if status == 503:
        assert int(headers["Retry-After"]) >= 1, headers


async def _client(
    n: int, url: str, key: str, stop: asyncio.Event, tally: Tally, http: aiohttp.ClientSession
) -> None:
    """Conversations of three turns, one after another, each named by its id after the
    first reply; a refused turn is sent again after a pause."""
    serial = 0
    while not stop.is_set():
        serial += 1
        history = [{"role": "user", "content": f"Client {n}, conversation {serial}: hello."}]
        named: str | None = None
        turn = 0
        while turn < 3 and not stop.is_set():
            headers = {"Authorization": f"Bearer {key}"}
            if named:
                headers["X-Retrace-Conversation"] = named
            started = time.monotonic()
            try:
                async with http.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "bot", "messages": history},
                    headers=headers,
                ) as r:
                    body = await r.text()
                    tally.finished.append((started, time.monotonic(), r.status))
                    if r.status != 200:
                        tally.refused[r.status] += 1
                        _check_refusal(r.status, r.headers, body)
                        await asyncio.sleep(0.2)
                        continue
                    reply = json.loads(body)["choices"][0]["message"]
                    named = r.headers["X-Retrace-Conversation"]
            except (TimeoutError, aiohttp.ClientConnectionError):
                tally.unreachable += 1
                tally.dropped.append((started, time.monotonic()))
                await asyncio.sleep(0.2)
                continue
            tally.answered += 1
            tally.conversations.add(named)
            history += [reply, {"role": "user", "content": f"turn {turn + 1}"}]
            turn += 1


@contextlib.asynccontextmanager
async def _load(url: str, key: str, clients: int = 8) -> AsyncIterator[Tally]:
    tally = Tally()
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        tasks = [
            asyncio.create_task(_client(n, url, key, stop, tally, http)) for n in range(clients)
        ]
        try:
            yield tally
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def _stored(database_url: str) -> tuple[int, int, int]:
    """(turns recorded, conversations, conversations without a trajectory) in the store."""
    store = Store.connect(DatabaseConfig(schema=SCHEMA, pool_size=1), database_url)
    try:
        async with store.tenant("acme") as session:
            turns = await session.scalar(select(func.coalesce(func.sum(Conversation.turns), 0)))
            conversations = await session.scalar(select(func.count()).select_from(Conversation))
            bare = await session.scalar(
                select(func.count())
                .select_from(Conversation)
                .outerjoin(Trajectory, Trajectory.id == Conversation.trajectory_id)
                .where(Trajectory.id.is_(None))
            )
        return int(turns or 0), int(conversations or 0), int(bare or 0)
    finally:
        await store.close()


async def _all_recorded(site: Site, tally: Tally) -> None:
    """The store ends up with exactly the turns the clients were answered."""
    seen: list[tuple[int, int, int]] = []

    async def settled() -> bool:
        seen.append(await _stored(site.database_url))
        return seen[-1] == (tally.answered, len(tally.conversations), 0)

    try:
        await eventually(settled, within=60)
    except AssertionError:
        raise AssertionError(
            f"answered {tally.answered} turns of {len(tally.conversations)} conversations; "
            f"the store has (turns, conversations, without trajectory) {seen[-1]}\n{site.logs()}"
        ) from None


@contextlib.asynccontextmanager
async def _store_stopped_under_load(
    site: Site, **env: str
) -> AsyncIterator[tuple[subprocess.Popen[bytes], Tally, int]]:
    """A router (with `env`) under load, its Postgres stopped 1.5 s in: the router, what the
    clients saw, and the turns answered when the store stopped. The load goes on inside."""
    proc, url = site.start_router(**env)
    await _ready(proc, url, site)
    async with _load(url, site.key) as tally:
        await asyncio.sleep(1.5)
        await asyncio.to_thread(stop_postgres, site.root)
        yield proc, tally, tally.answered


async def test_postgres_stopped_under_load_loses_no_answered_turn(site: Site) -> None:
    """Issue 14: Postgres stopped for 10 s under load gave 187 of 200 requests a bare 500
    and lost replies already generated. Now a request the router cannot serve without the
    store is a 503 with Retry-After, and every answered turn is in the store once it is
    back."""
    proc, url = site.start_router()
    await _ready(proc, url, site)
    async with _load(url, site.key) as tally:
        await asyncio.sleep(2)
        before = tally.answered
        await asyncio.to_thread(stop_postgres, site.root)
        await asyncio.sleep(6)
        during = tally.answered - before
        await asyncio.to_thread(ensure_postgres, site.root)
        await asyncio.sleep(4)
    assert before > 0 and proc.poll() is None, site.logs()
    assert set(tally.refused) <= {503}, tally.refused
    assert not tally.unreachable, tally  # a refusal, never a connection dropped
    await _all_recorded(site, tally)
    site.without_user_content()
    assert tally.answered > before + during  # and on after it came back


async def test_a_store_down_past_the_queue_s_limit_is_503_and_no_answered_turn_lost(
    site: Site,
) -> None:
    """Past `unrecorded_limit` turns waiting, the router used to answer on and log each new
    turn as lost (the router benchmark lost 13,256 of 34,854 turns in 40 s when its loop fell
    behind). Now it refuses new requests with a 503 and Retry-After until the store takes
    the turns waiting, and every turn it answered is in the store afterwards."""
    limited = _store_stopped_under_load(site, RETRACE_ROUTER_UNRECORDED_LIMIT="20")
    async with limited as (proc, tally, stopped_at):
        await asyncio.sleep(4)
        during = tally.answered - stopped_at
        await asyncio.to_thread(ensure_postgres, site.root)
        await asyncio.sleep(4)
    assert proc.poll() is None, site.logs()
    assert tally.refused[503] > 0, tally.refused  # the queue filled
    assert during <= 20 + 8, (during, tally.refused)  # what waited, and the clients' last
    assert tally.answered > stopped_at + during  # and served again once the store was back
    await _all_recorded(site, tally)
    assert "production trajectory lost" not in site.logs()


async def test_nats_killed_under_load_is_no_outage_for_chats(site: Site) -> None:
    """The router publishes nothing a chat needs: its bus gone under load, every request is
    still answered and recorded, and a router started meanwhile serves too (one used to
    wait for NATS to start, and to exit once its reconnection attempts ran out)."""
    proc, url = site.start_router()
    await _ready(proc, url, site)
    async with _load(url, site.key) as tally:
        await asyncio.sleep(1.5)
        site.nats.kill()
        killed_at = tally.answered
        second, second_url = site.start_router()
        await _ready(second, second_url, site)
        async with _load(second_url, site.key) as on_second:
            await asyncio.sleep(3)
        assert tally.answered > killed_at  # answered on without it
        site.nats.start()
        await asyncio.sleep(1)
    assert proc.poll() is None and second.poll() is None, site.logs()
    assert not tally.refused and not tally.unreachable, tally
    assert on_second.answered > 0 and not on_second.refused, on_second
    merged = Tally(
        tally.answered + on_second.answered, tally.conversations | on_second.conversations
    )
    await _all_recorded(site, merged)


async def test_the_upstream_gone_under_load_is_502_and_nothing_half_recorded(site: Site) -> None:
    proc, url = site.start_router()
    await _ready(proc, url, site)
    async with _load(url, site.key) as tally:
        await asyncio.sleep(1.5)
        await site.upstream.stop()
        await asyncio.sleep(3)
        await site.upstream.start()
        await asyncio.sleep(1.5)
    assert tally.refused[502] > 0 and set(tally.refused) == {502}, tally.refused
    assert not tally.unreachable, tally  # a 502, never a connection dropped
    await _all_recorded(site, tally)
    site.without_user_content()


async def test_sigterm_under_load_finishes_what_is_in_flight(site: Site) -> None:
    """Issue 14: SIGTERM failed the requests in flight with a 502. Now the listener stops
    first, the requests in flight get their replies, and their turns are written before
    the process exits 0."""
    site.upstream.delay = 0.5
    proc, url = site.start_router()
    await _ready(proc, url, site)
    async with _load(url, site.key, clients=12) as tally:
        await asyncio.sleep(2)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        exit_code = await asyncio.to_thread(proc.wait, 30)
    assert exit_code == 0, site.logs()
    assert not tally.refused, tally.refused  # no 502 for a request already taken
    across = [s for started, ended, s in tally.finished if started < signalled < ended]
    assert across and set(across) == {200}, across
    # none in flight went without a reply (once the listener has stopped, new connections
    # are refused: those are dropped, after the signal; 0.25 s for a request on its way
    # on a loaded machine, half the endpoint's delay)
    lost = [(started, ended) for started, ended in tally.dropped if started < signalled - 0.25]
    assert not lost, (signalled, lost)
    await _all_recorded(site, tally)


async def _recorded_by_the_next_router(site: Site, tally: Tally) -> None:
    """Postgres back, a router started: every answered turn stored, the spool emptied."""
    await asyncio.to_thread(ensure_postgres, site.root)
    again, url = site.start_router()
    await _ready(again, url, site)
    await _all_recorded(site, tally)
    assert not list(site.spool.iterdir()), "the spool was not emptied"


async def test_sigterm_while_the_store_is_down_keeps_the_answered_turns(site: Site) -> None:
    """Turns answered while Postgres is down wait in the router's memory; a router stopped
    then writes them to its spool, and the next router to start records them."""
    site.upstream.delay = 1.0  # so that requests are in flight when the store stops
    async with _store_stopped_under_load(site) as (proc, tally, stopped_at):
        await asyncio.sleep(3)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)
    assert tally.answered > stopped_at, tally  # there was something to keep
    assert list(site.spool.glob("*.jsonl")), "nothing spooled"
    assert not list(site.spool.glob("*.journal")), "the journal outlived its spooled turns"
    await _recorded_by_the_next_router(site, tally)


async def test_a_router_killed_while_the_store_is_down_leaves_its_turns_to_the_next(
    site: Site,
) -> None:
    """Turns the store refused are journaled at the recorder's next retry: a router killed
    (no shutdown of its own) after that leaves them on disk, and the next router records
    them. What a router answered after its last retry and before it died would be lost with
    it: here the load stops 3 s into the outage and the router is killed after 8 s, past the
    retries at 3.5 and 7.5 s."""
    site.upstream.delay = 1.0
    async with _store_stopped_under_load(site) as (proc, tally, stopped_at):
        await asyncio.sleep(2)
    await asyncio.sleep(6)  # the recorder retries at 3.5 and 7.5 s into the outage
    proc.kill()
    await asyncio.to_thread(proc.wait, 30)
    assert tally.answered > stopped_at, tally
    assert list(site.spool.glob("*.journal")), "nothing journaled"
    await _recorded_by_the_next_router(site, tally)


async def test_a_router_s_start_up_objects_are_out_of_the_collector_s_way(site: Site) -> None:
    """While a router served, each full collection walked the 125,000 objects its start-up
    made (modules, the routing tables) for over 100 ms, every request in flight waiting
    (session 24). A service run as its own process freezes them once started."""
    proc, url = site.start_router()
    await _ready(proc, url, site)
    started = [
        json.loads(line)
        for line in site.logs().splitlines()
        if line.startswith("{") and '"service started"' in line
    ]
    assert started and started[0]["frozen_objects"] > 10_000, site.logs()
