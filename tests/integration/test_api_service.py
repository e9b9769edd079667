"""The control API on real Postgres and NATS: a tenant with only an API key creates an agent,
starts a cycle (published on the bus), follows it as Server-Sent Events and cancels it;
lists are paged; bad input gets a JSON 400; keys rotate; the operator's routes need the
admin key; and no route lets one tenant see, change or learn of another's objects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nats
import pytest
from sqlalchemy import select

from services.api.config import ApiConfig
from services.api.openapi import ROUTES
from services.api.service import build
from shared.bus.streams import stream_for
from shared.config import EnvironmentsConfig, ServiceConfig
from shared.errors import RetryableError
from shared.messages import CycleRequested
from shared.runtime.service import Service
from shared.store import Store
from shared.store.agents import create_agent, get_agent
from shared.store.models import (
    Adapter,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    Trajectory,
)
from shared.store.tenants import create_tenant, issue_api_key
from tests.integration.test_delivery import eventually, healthy
from tests.support.raw_http import raw_status

pytestmark = pytest.mark.timeout(120)
ADMIN = "operator-secret-key"


class Api:
    def __init__(
        self, url: str, http: aiohttp.ClientSession, keys: dict[str, str], service: Service
    ) -> None:
        self.url = url
        self.http = http
        self.keys = keys
        self.service = service

    async def call(
        self, method: str, path: str, tenant: str | None = "acme", body: Any = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        headers.update(kw.pop("headers", {}))
        data = body if isinstance(body, bytes) else None
        payload = None if isinstance(body, bytes) or body is None else body
        async with self.http.request(
            method, self.url + path, json=payload, data=data, headers=headers, **kw
        ) as r:
            text = await r.text()
            assert r.content_type in ("application/json", "text/event-stream"), text
            return r.status, json.loads(text) if r.content_type == "application/json" else text


@pytest.fixture
async def api(service_cfg: ServiceConfig, store: Store) -> AsyncIterator[Api]:
    async with running_api(service_cfg, store) as running:
        yield running


@contextlib.asynccontextmanager
async def running_api(service_cfg: ServiceConfig, store: Store, **given: Any) -> AsyncIterator[Api]:
    """The control API on `service_cfg` (its fields replaced by `given`), with tenants acme
    and globex and a key of each."""
    keys = {}
    for tenant in ("acme", "globex"):
        async with store.cross_tenant() as session:
            await create_tenant(session, tenant)
        async with store.tenant(tenant) as session:
            keys[tenant] = await issue_api_key(session, tenant)
    keys["admin"] = ADMIN
    fields = {f: getattr(service_cfg, f) for f in ServiceConfig.__struct_fields__}
    cfg = ApiConfig(**{**fields, **given}, admin_key=ADMIN, events_poll_s=0.1)
    service = build(cfg)
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    async with aiohttp.ClientSession() as http:
        yield Api(f"http://127.0.0.1:{service.bound_port}", http, keys, service)
    service.stop()
    await run


async def test_agents_are_created_listed_in_pages_changed_and_deleted(api: Api) -> None:
    for n in range(5):
        status, made = await api.call(
            "POST", "/v1/agents", body={"name": f"bot{n}", "model": "m", "environment": "toolbox"}
        )
        assert status == 201 and made["name"] == f"bot{n}"
    seen: list[str] = []
    cursor = None
    while True:
        query = f"?limit=2{f'&cursor={cursor}' if cursor else ''}"
        status, page = await api.call("GET", f"/v1/agents{query}")
        assert status == 200 and len(page["data"]) <= 2
        seen += [a["name"] for a in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"bot{n}" for n in reversed(range(5))]  # newest first, each once
    status, changed = await api.call(
        "PATCH", "/v1/agents/bot1", body={"system_prompt": "Be brief.", "model": "qwen"}
    )
    assert status == 200 and (changed["system_prompt"], changed["model"]) == ("Be brief.", "qwen")
    assert (await api.call("GET", "/v1/agents/bot1"))[1]["environment"] == "toolbox"
    assert (await api.call("DELETE", "/v1/agents/bot1"))[0] == 200
    assert (await api.call("GET", "/v1/agents/bot1"))[0] == 404
    status, again = await api.call(
        "POST", "/v1/agents", body={"name": "bot2", "model": "m", "environment": "toolbox"}
    )
    assert status == 409 and "already exists" in again["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "says"),
    [
        ("POST", "/v1/agents", b"{not json", "invalid request body"),
        ("POST", "/v1/agents", {"name": "x", "model": "m"}, "environment"),
        ("POST", "/v1/agents", {"name": "Bad Name", "model": "m", "environment": "toolbox"},
         "name"),
        ("POST", "/v1/agents", {"name": "x", "model": "m", "environment": "toolbox", "tools": 1},
         "tools"),
        ("POST", "/v1/agents", {"name": "x", "model": "m", "environment": "nowhere"},
         "unknown environment"),
        ("POST", "/v1/agents", {"name": "x", "model": "m\u0000", "environment": "toolbox"},
         "model"),
        ("GET", "/v1/agents?limit=0", None, "limit"),
        ("GET", "/v1/agents?limit=many", None, "limit"),
        ("GET", "/v1/agents?cursor=garbage", None, "cursor"),
        ("GET", "/v1/trajectories?source=dreams", None, "source"),
        ("GET", "/v1/capabilities?cycle=not-an-id", None, "cycle"),
        ("POST", "/v1/agents/none/cycles", {"settings": {"eval_trials": 0}}, "eval_trials"),
    ],
)  # fmt: skip
async def test_bad_input_gets_a_json_400_that_says_what(
    api: Api, method: str, path: str, body: Any, says: str
) -> None:
    status, out = await api.call(method, path, body=body)
    assert status == 400, out
    assert says in out["error"]["message"] and out["error"]["code"] == 400


async def test_keys_are_checked_rotated_and_revoked(api: Api) -> None:
    assert (await api.call("GET", "/v1/agents", tenant=None))[0] == 401
    status, out = await api.call("GET", "/v1/agents", headers={"Authorization": "Bearer nope"})
    assert status == 401 and out["error"]["type"] == "authentication_error"
    status, made = await api.call("POST", "/v1/keys")
    assert status == 201
    old = api.keys["acme"]
    api.keys["acme"] = made["key"]
    assert (await api.call("GET", "/v1/agents"))[0] == 200  # the new key works
    status, revoked = await api.call("DELETE", f"/v1/keys/{old[:16]}")
    assert status == 200 and revoked["revoked_at"] is not None
    api.keys["acme"] = old
    assert (await api.call("GET", "/v1/agents"))[0] == 401
    api.keys["acme"] = made["key"]
    status, listed = await api.call("GET", "/v1/keys")
    assert [k["prefix"] for k in listed["data"]] == [made["key"][:16], old[:16]]
    assert "key" not in listed["data"][0]  # never shown again
    # a key is also named by its id (its prefix names it only for a short tenant id)
    status, spare = await api.call("POST", "/v1/keys")
    listed_ids = {k["prefix"]: k["id"] for k in (await api.call("GET", "/v1/keys"))[1]["data"]}
    status, revoked = await api.call("DELETE", f"/v1/keys/{listed_ids[spare['key'][:16]]}")
    assert status == 200 and revoked["prefix"] == spare["key"][:16]
    status, again = await api.call("DELETE", f"/v1/keys/{revoked['id']}")
    assert status == 404 and "no live key" in again["error"]["message"]


async def test_a_key_does_only_what_its_scope_allows(api: Api) -> None:
    """An application's key (`inference`) cannot reach the control API at all, so leaked it
    mints no keys and changes no agent; a `read` key reads and changes nothing; only an
    `all` key makes keys, of any scope (before, every key could do everything)."""
    made = {}
    for scope in ("inference", "read"):
        status, out = await api.call("POST", "/v1/keys", body={"name": "app", "scope": scope})
        assert status == 201 and out["scope"] == scope, out
        made[scope] = out["key"]
    status, listed = await api.call("GET", "/v1/keys")
    assert {k["prefix"]: k["scope"] for k in listed["data"]} == {
        made["inference"][:16]: "inference", made["read"][:16]: "read",
        api.keys["acme"][:16]: "all",
    }  # fmt: skip
    agent = {"name": "bot", "model": "m", "environment": "toolbox"}
    api.keys["app"] = made["inference"]
    for method, path, body in (
        ("GET", "/v1/agents", None),
        ("POST", "/v1/agents", agent),
        ("POST", "/v1/keys", {"scope": "all"}),
        ("DELETE", f"/v1/keys/{made['read'][:16]}", None),
    ):
        status, out = await api.call(method, path, tenant="app", body=body)
        assert status == 403, (method, path, out)
        assert out["error"]["type"] == "permission_error"
        assert "router only" in out["error"]["message"]
    api.keys["viewer"] = made["read"]
    assert (await api.call("GET", "/v1/agents", tenant="viewer"))[0] == 200
    assert (await api.call("GET", "/v1/keys", tenant="viewer"))[0] == 200
    for method, path, body in (
        ("POST", "/v1/agents", agent),
        ("POST", "/v1/keys", None),
        ("DELETE", f"/v1/keys/{made['inference'][:16]}", None),
    ):
        status, out = await api.call(method, path, tenant="viewer", body=body)
        assert status == 403 and "may not change anything" in out["error"]["message"], out
    assert (await api.call("GET", "/v1/agents/bot"))[0] == 404  # nothing was made
    status, out = await api.call("POST", "/v1/keys", body={"scope": "everything"})
    assert status == 400 and "scope" in out["error"]["message"], out
    # the operator makes a tenant's key of a scope too; an empty body is a key of scope all
    status, out = await api.call(
        "POST", "/v1/admin/tenants/globex/keys", tenant="admin", body={"scope": "inference"}
    )
    assert status == 201 and out["scope"] == "inference" and out["key"].startswith("rt_globex_")
    status, out = await api.call("POST", "/v1/admin/tenants/globex/keys", tenant="admin")
    assert status == 201 and out["scope"] == "all"


async def test_operator_routes_need_the_admin_key(api: Api) -> None:
    assert (await api.call("GET", "/v1/admin/tenants"))[0] == 401  # a tenant's key
    status, made = await api.call(
        "POST", "/v1/admin/tenants", tenant="admin", body={"id": "initech"}
    )
    assert status == 201 and made["id"] == "initech"
    status, key = await api.call("POST", "/v1/admin/tenants/initech/keys", tenant="admin")
    assert status == 201
    api.keys["initech"] = key["key"]
    assert (await api.call("GET", "/v1/agents", tenant="initech")) == (
        200,
        {"data": [], "next_cursor": None},
    )
    status, tenants = await api.call("GET", "/v1/admin/tenants", tenant="admin")
    assert {t["id"] for t in tenants["data"]} >= {"acme", "globex", "initech"}
    assert (await api.call("POST", "/v1/admin/tenants/nobody/keys", tenant="admin"))[0] == 404


async def test_the_admin_key_acts_for_the_tenant_it_names_and_a_tenant_key_never_does(
    api: Api,
) -> None:
    """The CLI's path: the operator's key with `Retrace-Tenant` acts for that tenant; the
    header means nothing beside a tenant's own key (it cannot reach another tenant)."""
    agent = {"name": "bot", "model": "m", "environment": "toolbox"}
    acting = {"headers": {"Retrace-Tenant": "globex"}}
    status, made = await api.call("POST", "/v1/agents", "admin", body=agent, **acting)
    assert status == 201
    status, listed = await api.call("GET", "/v1/agents", "globex")
    assert [a["id"] for a in listed["data"]] == [made["id"]]
    status, out = await api.call("GET", "/v1/agents", "admin")
    assert status == 401 and "Retrace-Tenant" in out["error"]["message"]
    nobody = {"headers": {"Retrace-Tenant": "nobody"}}
    status, out = await api.call("GET", "/v1/agents", "admin", **nobody)
    assert status == 404 and "no tenant 'nobody'" in out["error"]["message"]
    # acme's key naming globex still sees acme's (empty) list, and creates in acme
    assert (await api.call("GET", "/v1/agents", "acme", **acting))[1]["data"] == []
    assert (await api.call("GET", "/v1/agents/bot", "acme", **acting))[0] == 404


async def test_quotas_set_by_the_operator_refuse_with_a_429_that_says_which(
    api: Api, store: Store
) -> None:
    """The operator caps acme at one agent, one cycle at once and two a day: the second
    agent and a cycle beyond either limit get a 429 naming the quota (with Retry-After where
    waiting helps); globex is not limited. (The evaluator's own check, for requests that
    get past this one, is tests/integration/test_cycle.py's.)"""
    limits = {"max_agents": 1, "max_active_cycles": 1, "max_cycles_per_day": 2}
    status, out = await api.call("PUT", "/v1/admin/tenants/acme/quotas", "acme", body=limits)
    assert status == 401  # a tenant cannot raise its own
    bad = {"max_agents": -1}
    status, out = await api.call("PUT", "/v1/admin/tenants/acme/quotas", "admin", body=bad)
    assert status == 400 and "max_agents" in out["error"]["message"]
    status, out = await api.call("PUT", "/v1/admin/tenants/acme/quotas", "admin", body=limits)
    assert status == 200 and out["quotas"] == {
        **limits, "requests_per_s": None, "request_burst": None, "tokens_per_min": None,
    }  # fmt: skip
    for wrong in (
        {"requests_per_s": 0}, {"request_burst": 0}, {"requests_per_s": "fast"},
        {"tokens_per_min": 0}, {"tokens_per_min": 2.5},
    ):  # fmt: skip
        status, out = await api.call("PUT", "/v1/admin/tenants/acme/quotas", "admin", body=wrong)
        assert status == 400 and next(iter(wrong)) in out["error"]["message"], out
    assert (await api.call("PUT", "/v1/admin/tenants/nobody/quotas", "admin", body={}))[0] == 404
    agent = {"name": "bot", "model": "m", "environment": "toolbox"}
    assert (await api.call("POST", "/v1/agents", body=agent))[0] == 201
    status, out = await api.call("POST", "/v1/agents", body={**agent, "name": "bot2"})
    assert status == 429 and out["error"]["type"] == "quota_exceeded"
    assert "max_agents" in out["error"]["message"]
    assert (await api.call("POST", "/v1/agents", "globex", body={**agent, "name": "bot2"}))[
        0
    ] == 201
    status, mine = await api.call("GET", "/v1/quotas")
    assert status == 200 and mine["quotas"] == {
        **limits,
        "requests_per_s": None,
        "request_burst": None,
        "tokens_per_min": None,
    }
    assert mine["usage"] == {"agents": 1, "active_cycles": 0, "cycles_last_day": 0}
    # one cycle under way (the evaluator's row, played here): a second is over quota
    async with store.tenant("acme") as session:
        bot = await get_agent(session, "bot")
        session.add(Cycle(agent_id=bot.id, state="training"))
    async with api.http.post(
        f"{api.url}/v1/agents/bot/cycles", json={},
        headers={"Authorization": f"Bearer {api.keys['acme']}"},
    ) as r:  # fmt: skip
        assert r.status == 409  # this agent's own cycle comes first
    async with store.tenant("acme") as session:
        for c in await session.scalars(select(Cycle)):
            c.state = "completed"
        session.add(Cycle(agent_id=bot.id, state="completed"))  # two today
        # refused before it began (no diagnosis): not counted
        session.add(Cycle(agent_id=bot.id, state="failed", reason="quota: at once"))
    status, mine = await api.call("GET", "/v1/quotas")
    assert mine["usage"] == {"agents": 1, "active_cycles": 0, "cycles_last_day": 2}, mine
    async with api.http.post(
        f"{api.url}/v1/agents/bot/cycles", json={},
        headers={"Authorization": f"Bearer {api.keys['acme']}"},
    ) as r:  # fmt: skip
        out = await r.json()
        assert r.status == 429 and "a day" in out["error"]["message"], out
        assert 86_000 < int(r.headers["Retry-After"]) <= 86_401
    status, out = await api.call("PUT", "/v1/admin/tenants/acme/quotas", "admin", body={})
    assert status == 200 and out["quotas"] == {
        "max_agents": None, "max_active_cycles": None, "max_cycles_per_day": None,
        "requests_per_s": None, "request_burst": None, "tokens_per_min": None,
    }  # fmt: skip
    assert (await api.call("POST", "/v1/agents/bot/cycles", body={}))[0] == 202


async def test_a_cycle_is_requested_on_the_bus_followed_live_and_cancelled(
    api: Api, store: Store, service_cfg: ServiceConfig
) -> None:
    await api.call(
        "POST", "/v1/agents", body={"name": "bot", "model": "m", "environment": "toolbox"}
    )
    cycle_id = str(uuid.uuid4())
    status, out = await api.call(
        "POST",
        "/v1/agents/bot/cycles",
        body={"cycle_id": cycle_id, "settings": {"diagnose_tasks": 4, "baselines": []}},
    )
    assert status == 202 and out["state"] == "requested"
    nc = await nats.connect(service_cfg.nats.url or "")
    try:
        stream = stream_for(service_cfg.nats, CycleRequested)
        found = await nc.jetstream().get_last_msg(stream, f"{service_cfg.nats.subject_prefix}.>")
    finally:
        await nc.close()
    assert cycle_id.encode() in (found.data or b"") and b"diagnose_tasks" in (found.data or b"")
    # recorded as requested before it was published: it can be followed at once
    status, got = await api.call("GET", f"/v1/cycles/{cycle_id}")
    assert status == 200 and got["state"] == "requested"
    assert got["data"]["settings"]["diagnose_tasks"] == 4
    status, again = await api.call("POST", "/v1/agents/bot/cycles", body={})
    assert status == 409 and cycle_id in again["error"]["message"]
    status, repeat = await api.call(
        "POST", "/v1/agents/bot/cycles", body={"cycle_id": cycle_id}
    )  # sent again as first asked
    assert status == 202 and repeat["data"]["settings"]["diagnose_tasks"] == 4
    events: list[dict[str, Any]] = []

    async def follow() -> None:
        async with api.http.get(
            f"{api.url}/v1/cycles/{cycle_id}/events",
            headers={"Authorization": f"Bearer {api.keys['acme']}"},
        ) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            async for line in r.content:
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))

    following = asyncio.create_task(follow())
    await eventually(lambda: _true(bool(events)))
    # the evaluator takes it (played here by the test): the stream shows each stage
    for stage in ("diagnosing", "synthesizing"):
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, uuid.UUID(cycle_id))
            assert row is not None
            row.state = stage
        await eventually(lambda stage=stage: _true(events[-1]["state"] == stage))
    status, cancelled = await api.call("POST", f"/v1/cycles/{cycle_id}/cancel")
    assert status == 200 and cancelled["state"] == "failed"
    assert "cancelled" in cancelled["reason"]
    await asyncio.wait_for(following, 10)  # the stream ends with the cycle
    assert [e["state"] for e in events] == ["requested", "diagnosing", "synthesizing", "failed"]
    status, twice = await api.call("POST", f"/v1/cycles/{cycle_id}/cancel")
    assert status == 409 and "already ended" in twice["error"]["message"]


async def test_a_cycle_whose_request_the_bus_does_not_confirm_is_sent_again_by_a_repeat(
    api: Api, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bus not confirming the publish (NATS down past the publisher's retries; the
    message may still have landed): a 503 with Retry-After saying to repeat with the same
    cycle_id; the row stays requested; the repeat once the bus is back publishes it, as
    first asked."""
    await api.call(
        "POST", "/v1/agents", body={"name": "bot", "model": "m", "environment": "toolbox"}
    )
    bus = api.service.bus
    assert bus is not None
    real = bus.publish
    sent: list[Any] = []

    async def refused(*_: object, **__: object) -> None:
        raise RetryableError("publish to retrace.x failed: no servers available")

    async def recorded(tenant: str, message: Any, *, msg_id: str) -> None:
        sent.append(message)
        await real(tenant, message, msg_id=msg_id)

    monkeypatch.setattr(bus, "publish", refused)
    start = {"cycle_id": str(uuid.uuid4()), "settings": {"diagnose_tasks": 3}}
    async with api.http.post(
        f"{api.url}/v1/agents/bot/cycles", json=start,
        headers={"Authorization": f"Bearer {api.keys['acme']}"},
    ) as r:  # fmt: skip
        out = await r.json()
        assert r.status == 503 and r.headers["Retry-After"], out
        assert "repeat this request with the same cycle_id" in out["error"]["message"]
    async with store.tenant("acme") as session:
        row = await session.get(Cycle, uuid.UUID(start["cycle_id"]))
        assert row is not None and row.state == "requested"
    monkeypatch.setattr(bus, "publish", recorded)
    status, out = await api.call(
        "POST", "/v1/agents/bot/cycles", body={"cycle_id": start["cycle_id"]}
    )
    assert status == 202 and out["id"] == start["cycle_id"] and out["state"] == "requested"
    [message] = sent
    assert message.settings.diagnose_tasks == 3  # as first asked, not the repeat's defaults


async def test_a_tenant_names_no_server_file_and_makes_the_api_fetch_no_url(api: Api) -> None:
    """An agent's environment as a tenant gives it: an `mcp:` file is a path on the server
    (a tenant learnt whether files exist, and read lines of them in the error); an HTTP URL is
    stored, not fetched by the API (it fetched any URL a tenant named and quoted the answer)."""
    agent = {"name": "bot", "model": "m", "environment": "mcp:/etc/passwd"}
    status, out = await api.call("POST", "/v1/agents", body=agent)
    assert status == 403 and "only the operator" in out["error"]["message"], out
    assert "root" not in json.dumps(out)
    public = "http://8.8.8.8:8600/env"  # stored, not reached
    status, out = await api.call("POST", "/v1/agents", body={**agent, "environment": public})
    assert status == 201 and out["environment"] == public
    # the services would call it from inside the deployment: not its network, not the cloud's
    # instance metadata, and no query or fragment that drops the protocol's own paths
    for url, says in (
        ("http://127.0.0.1:8600", "private network"),
        ("http://10.1.2.3", "private network"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://[fe80::1]:8600", "link-local"),
        ("http://8.8.8.8/secret?", "query"),
        ("http://8.8.8.8/secret#", "fragment"),
        ("http://user:pw@8.8.8.8/", "user or password"),
        ("http://localhost:8600", "private network"),
    ):
        status, out = await api.call("PATCH", "/v1/agents/bot", body={"environment": url})
        assert status == 400 and says in out["error"]["message"], (url, out)
    # the operator names a server inside the network (the CLI on the server does)
    status, out = await api.call(
        "PATCH",
        "/v1/agents/bot",
        tenant="admin",
        body={"environment": "http://127.0.0.1:8600"},
        headers={"Retrace-Tenant": "acme"},
    )
    assert status == 200 and out["environment"] == "http://127.0.0.1:8600", out
    status, out = await api.call(
        "PATCH", "/v1/agents/bot", body={"environment": "mcp:/nonexistent/file.yaml"}
    )
    assert status == 403, out


async def test_where_no_service_may_reach_a_private_address_nobody_names_one(
    service_cfg: ServiceConfig, store: Store
) -> None:
    """With `RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false` the services refuse private answers
    at every connection (shared/envs/remote/address.py); the API then refuses such a URL
    when it is named, the operator's too, saying which setting holds."""
    closed = EnvironmentsConfig(private_allowed=False)
    async with running_api(
        service_cfg, store, environments=closed, tenant_environments_private=True
    ) as api:
        agent = {"name": "bot", "model": "m", "environment": "http://8.8.8.8:8600"}
        assert (await api.call("POST", "/v1/agents", body=agent))[0] == 201
        for tenant, headers in (("acme", {}), ("admin", {"Retrace-Tenant": "acme"})):
            status, out = await api.call(
                "PATCH",
                "/v1/agents/bot",
                tenant=tenant,
                body={"environment": "http://127.0.0.1:8600"},
                headers=headers,
            )
            assert status == 400, (tenant, out)
            assert "RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false" in out["error"]["message"]


async def test_the_same_start_sent_twice_at_once_is_one_cycle(api: Api, store: Store) -> None:
    """A client retrying a start whose answer it did not get: the two requests race; both
    are answered 202 with the one cycle (not a 409, nor a 429 from the first's row)."""
    await api.call("PUT", "/v1/admin/tenants/acme/quotas", "admin", body={"max_active_cycles": 1})
    await api.call(
        "POST", "/v1/agents", body={"name": "bot", "model": "m", "environment": "toolbox"}
    )
    for _ in range(3):
        body = {"cycle_id": str(uuid.uuid4())}
        answers = await asyncio.gather(
            *(api.call("POST", "/v1/agents/bot/cycles", body=body) for _ in range(2))
        )
        assert [status for status, _ in answers] == [202, 202], answers
        assert {out["id"] for _, out in answers} == {body["cycle_id"]}
        async with store.tenant("acme") as session:  # ended, so the next round may start
            row = await session.get(Cycle, uuid.UUID(body["cycle_id"]))
            assert row is not None
            row.state = "completed"


async def test_evaluations_per_configuration_and_per_task(api: Api, store: Store) -> None:
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="m", environment="toolbox")
        cycle = Cycle(agent_id=agent.id, state="completed")
        session.add(cycle)
        await session.flush()
        for name, successes in (("base", 0), ("routed", 2)):
            session.add(
                Evaluation(
                    agent_id=agent.id, cycle_id=cycle.id, configuration=name,
                    summary={"pass_rate": successes / 2, "ci95": [0.1, 0.9]},
                    results=[{"task": "t1", "trials": 2, "successes": successes}],
                )
            )  # fmt: skip
        other = Cycle(agent_id=agent.id, state="completed")
        session.add(other)
    status, out = await api.call("GET", f"/v1/evaluations?cycle={cycle.id}")
    assert status == 200, out
    got = {e["configuration"]: e for e in out["data"]}
    assert set(got) == {"base", "routed"} and got["routed"]["summary"]["pass_rate"] == 1.0
    assert got["base"]["results"] == [{"task": "t1", "trials": 2, "successes": 0}]
    status, out = await api.call("GET", f"/v1/evaluations?cycle={uuid.uuid4()}")
    assert status == 200 and out["data"] == []
    status, out = await api.call("GET", "/v1/evaluations?cycle=nope")
    assert status == 400 and "cycle" in out["error"]["message"]


async def test_environments_registered_first_then_the_tenant_s_synthesized_in_pages(
    api: Api, store: Store
) -> None:
    for i in range(3):  # one transaction each: three creation times
        async with store.tenant("acme") as session:
            session.add(Environment(name=f"synthetic/skill-{i}", kind="synthetic", status="ready"))
    async with store.tenant("globex") as session:
        session.add(Environment(name="synthetic/theirs", kind="synthetic", status="ready"))
    status, first = await api.call("GET", "/v1/environments?limit=2")
    assert status == 200 and first["next_cursor"], first
    names = [e["name"] for e in first["data"]]
    assert "toolbox" in names and names[-2:] == ["synthetic/skill-2@1", "synthetic/skill-1@1"]
    status, second = await api.call(
        "GET", f"/v1/environments?limit=2&cursor={first['next_cursor']}"
    )
    assert status == 200 and second["next_cursor"] is None
    assert [e["name"] for e in second["data"]] == ["synthetic/skill-0@1"]  # registered: page 1


async def _true(value: bool) -> bool:
    return value


async def test_adapters_are_promoted_and_demoted_by_hand(api: Api, store: Store) -> None:
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "bot", model="m", environment="toolbox")
        ready = Adapter(agent_id=agent.id, name="bot--a", base_model="m", status="ready")
        training = Adapter(agent_id=agent.id, name="bot--b", base_model="m")
        session.add_all([ready, training])
        await session.flush()
        ids = str(ready.id), str(training.id)
    status, out = await api.call("POST", f"/v1/adapters/{ids[0]}/promote")
    assert status == 200 and out["production"] is True
    assert (await api.call("GET", "/v1/agents/bot"))[1]["production_adapters"] == [ids[0]]
    status, refused = await api.call("POST", f"/v1/adapters/{ids[1]}/promote")
    assert status == 409 and "not ready" in refused["error"]["message"]
    listed = (await api.call("GET", "/v1/adapters?agent=bot"))[1]["data"]
    assert {a["id"]: a["production"] for a in listed} == {ids[0]: True, ids[1]: False}
    assert (await api.call("POST", f"/v1/adapters/{ids[0]}/demote"))[1]["production"] is False
    assert (await api.call("GET", "/v1/agents/bot"))[1]["production_adapters"] == []


async def test_no_route_shows_changes_or_reveals_another_tenant_s_objects(
    api: Api, store: Store
) -> None:
    """Globex's agent, cycle, capability, adapter and trajectory, asked for with acme's key
    on every documented route: each answer is a 404 or a list without them, and no answer
    names them."""
    async with store.tenant("globex") as session:
        agent = await create_agent(session, "secret-bot", model="m", environment="toolbox")
        cycle = Cycle(agent_id=agent.id, state="diagnosing")
        session.add(cycle)
        await session.flush()
        capability = Capability(
            agent_id=agent.id, cycle_id=cycle.id, name="secret_skill", definition="hidden"
        )
        session.add(capability)
        await session.flush()
        adapter = Adapter(
            agent_id=agent.id, capability_id=capability.id, name="secret-bot--x",
            base_model="m", status="ready",
        )  # fmt: skip
        trajectory = Trajectory(agent_id=agent.id, cycle_id=cycle.id, messages=[])
        evaluation = Evaluation(
            agent_id=agent.id, cycle_id=cycle.id, configuration="adapter:secret-bot--x",
            results=[{"task": "secret-task", "trials": 2}],
        )  # fmt: skip
        session.add_all([adapter, trajectory, evaluation])
        await session.flush()
        ids = {
            "name": agent.name,
            "id": str(cycle.id),
            "adapter": str(adapter.id),
            "trajectory": str(trajectory.id),
        }
    secrets = [agent.name, str(agent.id), str(cycle.id), str(capability.id), str(adapter.id),
               str(trajectory.id), "secret_skill", str(evaluation.id), "secret-task"]  # fmt: skip
    globex_key_prefix = api.keys["globex"][:16]
    answers = []
    for route in ROUTES:
        if route.path.startswith("/v1/admin") or not route.path.startswith("/v1"):
            continue
        path = (
            route.path.replace("{name}", ids["name"])
            .replace("{prefix}", globex_key_prefix)
            .replace("{id}", ids["trajectory"] if "trajector" in route.path else ids["id"])
        )
        if "/adapters/{id}" in route.path:
            path = route.path.replace("{id}", ids["adapter"])
        for query in ("", f"?agent={ids['name']}", f"?cycle={ids['id']}"):
            status, out = await api.call(
                route.method.upper(), path + (query if route.method == "get" else ""),
                body={} if route.request is not None else None,
                timeout=aiohttp.ClientTimeout(total=10),  # a leaked event stream never ends
            )  # fmt: skip
            answers.append((route.method, path + query, status, out))
    assert len(answers) > 40
    for method, path, status, out in answers:
        text = json.dumps(out) if not isinstance(out, str) else out
        leaked = [s for s in secrets if s in text and s not in path]
        assert not leaked, (method, path, status, text[:300])
        assert status in (200, 201, 404, 409) or (status == 400 and method != "get"), (
            method,
            path,
            status,
            text[:300],
        )
        if status == 200 and method == "get" and "data" in out:
            assert all(ids["name"] not in json.dumps(item) for item in out["data"])
    # nothing of globex's changed: its agent, key and adapter are as they were
    async with store.tenant("globex") as session:
        kept = await get_agent(session, "secret-bot")
        assert kept.production_adapters == []
        assert (await session.get(Cycle, cycle.id)).state == "diagnosing"  # type: ignore[union-attr]
    assert (await api.call("GET", "/v1/agents", tenant="globex"))[0] == 200


async def test_credentials_that_are_not_utf8_are_a_401_and_a_tenant_not_one_a_400(
    api: Api,
) -> None:
    """A bearer token or a cookie with bytes that are not UTF-8 was a 500 (raised while the
    key was hashed to be looked up); the operator's tenant header is checked before it is
    looked up."""
    port = int(api.url.rsplit(":", 1)[1])
    key = b"Authorization: Bearer rt_acme_\xff\xfe"
    assert await raw_status(port, b"GET /v1/agents HTTP/1.1\r\nHost: x\r\n" + key) == 401
    admin = b"Authorization: Bearer " + ADMIN.encode()
    for tenant in (b"acme\xff", b"ACME", b"a" * 64):
        head = b"GET /v1/agents HTTP/1.1\r\nHost: x\r\n" + admin + b"\r\nRetrace-Tenant: "
        assert await raw_status(port, head + tenant) == 400
    cookie = b"GET /console HTTP/1.1\r\nHost: x\r\nCookie: retrace_key=rt_\xff"
    assert await raw_status(port, cookie) == 303  # to the sign-in page
