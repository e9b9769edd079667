"""The console on a running control API with real data in Postgres: signing in with the key,
each page showing what the store holds (agents, a cycle's capabilities with the coverage plot,
environments with calibration, training curves, the evaluation table with intervals and
paired tests, routing against the oracle, a trajectory with its tool calls), another tenant's
cycle not found; then the same pages in headless Chromium, screenshots saved under
docs/console/ (when `RETRACE_CONSOLE_SCREENSHOTS` is set) and the live timeline following a
cycle that moves on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from services.api.config import ApiConfig
from services.api.service import build
from shared.config import ServiceConfig
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import (
    Adapter,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    Task,
    Trajectory,
)
from shared.store.tenants import create_tenant, issue_api_key
from tests.integration.test_delivery import eventually, healthy
from tests.support.browser import chromium, screenshots

pytestmark = pytest.mark.timeout(180)

REPORT = {
    "configs": {
        "base": {"episodes": 16, "pass_rate": 0.0625, "ci95": [0.011, 0.283],
                 "mean_reward": 0.21, "pass_hat_k": {"2": 0.0}},
        "adapter:coder--use_tools": {"episodes": 16, "pass_rate": 0.875, "ci95": [0.64, 0.965],
                                     "mean_reward": 0.9, "pass_hat_k": {"2": 0.75}},
        "routed": {"episodes": 16, "pass_rate": 0.875, "ci95": [0.64, 0.965],
                   "mean_reward": 0.9, "pass_hat_k": {"2": 0.75}},
    },
    "comparison": {"diff": 0.8125, "diff_ci95": [0.625, 0.9375], "mcnemar_p": 0.00024,
                   "bootstrap_p": 0.0001},
    "incumbent": "base",
    "rollouts_spent": {"adapter:coder--use_tools": 64, "routed": 64},
    "training_wall_s": {"base": 0.0, "adapter:coder--use_tools": 125.4, "routed": 125.4},
    "routing": {"task-1": "adapter:coder--use_tools", "task-2": "base"},
    "oracle": None,
    "verdict": {"promote": True, "reason": "routed beats base: +0.812, p=0.00024"},
}  # fmt: skip


async def _world(store: Store) -> dict[str, Any]:
    """A tenant's agent with one whole cycle in the store; another tenant's cycle."""
    for tenant in ("acme", "globex"):
        async with store.cross_tenant() as session:
            await create_tenant(session, tenant)
    async with store.tenant("acme") as session:
        key = await issue_api_key(session, "acme")
        agent = await create_agent(session, "coder", model="smollm2", environment="codebook")
        cycle = Cycle(
            agent_id=agent.id, state="completed", reason="promoted", data={"report": REPORT}
        )
        session.add(cycle)
        await session.flush()
        failed = Trajectory(
            agent_id=agent.id, cycle_id=cycle.id, model="smollm2", reward=0.0, success=False,
            messages=[
                {"role": "system", "content": "You are a code desk."},
                {"role": "user", "content": "What is code Q-17?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c1", "type": "function", "function": {
                     "name": "lookup_code", "arguments": "{\"code\": \"Q-17\"}"}}]},
                {"role": "tool", "name": "lookup_code", "content": "Q-17: <quiet hours>"},
                {"role": "assistant", "content": "Q-17 means quiet hours."},
                {"role": "<b>odd</b>", "content": "a role a caller made up"},
            ],
            reward_breakdown={"answer": 0.0, "used_tool": 1.0},
        )  # fmt: skip
        session.add(failed)
        await session.flush()
        capability = Capability(
            agent_id=agent.id, cycle_id=cycle.id, name="use_tools_when_needed",
            definition="Calls lookup_code before answering.",
            statistics={"coverage": 0.8, "delta": 0.45, "runs_passed": 3, "runs": 3},
            evidence={"failed_examples": [str(failed.id)]},
        )  # fmt: skip
        rejected = Capability(
            agent_id=agent.id, cycle_id=cycle.id, name="ask_for_missing_information",
            definition="Asks.", status="rejected",
            statistics={"coverage": 0.2, "delta": 0.05, "runs_passed": 0, "runs": 3},
        )  # fmt: skip
        session.add_all([capability, rejected])
        await session.flush()
        synthetic = Environment(
            name="use_tools_when_needed-on-codebook",
            kind="synthetic",
            capability_id=capability.id,
            calibration={"base_mean": 0.31, "accepted": True, "samples": 16},
        )
        session.add(synthetic)
        await session.flush()
        scenario = Task(environment_id=synthetic.id, external_id="s-1", split="train")
        session.add(scenario)
        await session.flush()
        episode = Trajectory(
            agent_id=agent.id, cycle_id=cycle.id, task_id=scenario.id, source="calibration",
            environment_id=synthetic.id, model="smollm2", reward=0.75, success=True,
            messages=[{"role": "user", "content": "What is code Z-9?"}],
        )  # fmt: skip
        session.add(episode)
        adapter = Adapter(
            agent_id=agent.id, capability_id=capability.id, cycle_id=cycle.id,
            name="coder--use_tools", base_model="smollm2", status="ready",
            training_curve=[{"step": i, "rollouts": 8 * (i + 1), "mean_reward": r}
                            for i, r in enumerate((0.3, 0.45, 0.7, 0.85, 0.9))],
            heldout={"gain": 0.2, "ci95": [0.05, 0.35]},
        )  # fmt: skip
        session.add(adapter)
        await session.flush()
        agent.production_adapters = [str(adapter.id)]
        for config, outcomes in (
            ("base", {"task-1": (0, 2), "task-2": (1, 2)}),
            ("adapter:coder--use_tools", {"task-1": (2, 2)}),
        ):
            session.add(
                Evaluation(
                    cycle_id=cycle.id,
                    agent_id=agent.id,
                    configuration=config,
                    results=[
                        {"task": t, "trials": n, "successes": s, "mean_reward": s / n}
                        for t, (s, n) in outcomes.items()
                    ],
                )
            )
        ids = {"cycle": str(cycle.id), "trajectory": str(failed.id), "agent": agent.id,
               "episode": str(episode.id)}  # fmt: skip
    async with store.tenant("globex") as session:
        other = await create_agent(session, "hidden", model="m", environment="toolbox")
        theirs = Cycle(agent_id=other.id, state="diagnosing")
        session.add(theirs)
        await session.flush()
        ids["theirs"] = str(theirs.id)
    return {"key": key, **ids}


@pytest.fixture
async def console(service_cfg: ServiceConfig, store: Store) -> AsyncIterator[dict[str, Any]]:
    world = await _world(store)
    fields = {f: getattr(service_cfg, f) for f in ServiceConfig.__struct_fields__}
    service = build(ApiConfig(**fields, events_poll_s=0.1))
    run = asyncio.create_task(service.run())
    await eventually(lambda: healthy(service))
    yield {"url": f"http://127.0.0.1:{service.bound_port}", **world}
    service.stop()
    await run


async def test_pages_show_the_store_to_the_signed_in_tenant_only(
    console: dict[str, Any],
) -> None:
    url = console["url"]
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{url}/console/agents", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/console/login"
        async with http.post(f"{url}/console/login", data={"key": "rt_nope"}) as r:
            assert r.status == 401 and "unknown or revoked" in await r.text()
        async with http.post(f"{url}/console/login", data={"key": console["key"]}) as r:
            assert r.status == 200 and "coder" in await r.text()  # followed to the agents
        cookie = next(c for c in jar if c.key == "retrace_key")
        assert cookie["httponly"] and cookie["samesite"] == "Strict"

        async def text(path: str, status: int = 200) -> str:
            async with http.get(url + path) as r:
                assert r.status == status, path
                assert r.content_type == "text/html"
                return await r.text()

        agent = await text("/console/agents/coder")
        assert "coder--use_tools" in agent and "+0.200 [+0.050, +0.350]" in agent
        cycle = await text(f"/console/cycles/{console['cycle']}")
        for shown in (
            "use_tools_when_needed", "0.800", "+0.450", "3/3",  # capability table
            "<svg", "coverage (share of failures lacking it)",  # its plot
            "use_tools_when_needed-on-codebook", "base_mean: 0.310",  # calibration
            f"{str(console['episode'])[:8]}</a> passed (0.750)",  # an example episode
            "mean reward per step",  # training curves
            "87.5%", "[64.0%, 96.5%]", "McNemar p=0.00024", "promoted", "2m05s",  # evaluation
            "routing matched the best played configuration on 2 of 2 tasks",  # vs the oracle
        ):  # fmt: skip
            assert shown in cycle, shown
        assert "EventSource" not in cycle  # an ended cycle's page does not follow anything
        trajectory = await text(f"/console/trajectories/{console['trajectory']}")
        assert "→ lookup_code({&quot;code&quot;: &quot;Q-17&quot;})" in trajectory
        assert "Q-17: &lt;quiet hours&gt;" in trajectory  # escaped, never markup
        assert "&lt;b&gt;odd&lt;/b&gt;" in trajectory and "<b>odd" not in trajectory
        assert "used_tool" in trajectory
        await text(f"/console/cycles/{console['theirs']}", 404)  # globex's
        await text("/console/agents/hidden", 404)
        await text("/console/trajectories/not-an-id", 404)
        async with http.post(f"{url}/console/logout", allow_redirects=False) as r:
            assert r.status == 303
        async with http.get(f"{url}/console/agents", allow_redirects=False) as r:
            assert r.status == 303


async def test_an_application_s_key_does_not_sign_in_and_a_read_key_does(
    console: dict[str, Any], store: Store
) -> None:
    """The console is the control API's reads: a key of scope `read` signs in, an
    application's (`inference`, the router only) is refused saying why."""
    async with store.tenant("acme") as session:
        app = await issue_api_key(session, "acme", "app", scope="inference")
        viewer = await issue_api_key(session, "acme", "dashboard", scope="read")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(f"{console['url']}/console/login", data={"key": app}) as r:
            assert r.status == 403 and "router only" in await r.text()
        async with http.get(
            f"{console['url']}/console/agents",
            allow_redirects=False,
            cookies={"retrace_key": app},
        ) as r:
            assert r.status == 303  # a cookie set by hand is no way round it
        async with http.post(f"{console['url']}/console/login", data={"key": viewer}) as r:
            assert r.status == 200 and "coder" in await r.text()


async def test_the_console_in_a_real_browser(console: dict[str, Any], store: Store) -> None:
    browser = chromium()
    shots = screenshots()
    from selenium.webdriver.common.by import By

    def run(*steps: Any) -> Any:
        return asyncio.to_thread(lambda: [step() for step in steps][-1])

    url = console["url"]

    async def shows(text: str) -> bool:
        return text in await run(lambda: browser.page_source)

    async def stage() -> str:
        found = await run(lambda: browser.find_element(By.CSS_SELECTOR, "#timeline span.on"))
        return str(await run(lambda: found.text))

    # every browser call runs off the event loop: the API answering the browser runs on it
    try:
        await run(lambda: browser.get(f"{url}/console/"))
        assert "Sign in" in await run(lambda: browser.title)
        field = await run(lambda: browser.find_element(By.NAME, "key"))
        await run(lambda: field.send_keys(console["key"]), lambda: field.submit())
        await eventually(lambda: shows("Agents of acme"))
        pages = {
            "agents": "/console/agents",
            "agent": "/console/agents/coder",
            "cycle": f"/console/cycles/{console['cycle']}",
            "trajectory": f"/console/trajectories/{console['trajectory']}",
        }
        for name, path in pages.items():
            await run(lambda path=path: browser.get(url + path))
            body = await run(lambda: browser.find_element(By.TAG_NAME, "main").text)
            title = await run(lambda: browser.title)
            assert "Internal" not in body and "error" not in title.lower()
            if shots is not None:
                shots.mkdir(parents=True, exist_ok=True)
                await run(lambda name=name: browser.save_screenshot(str(shots / f"{name}.png")))
        assert "lookup_code" in body  # the trajectory page was last
        # a cycle under way: the timeline follows it live, then the page shows the end
        async with store.tenant("acme") as session:
            live = Cycle(agent_id=console["agent"], state="diagnosing")
            session.add(live)
            await session.flush()
            live_id = live.id
        await run(lambda: browser.get(f"{url}/console/cycles/{live_id}"))
        assert await stage() == "diagnosing"
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, live_id)
            assert row is not None
            row.state = "training"

        async def training() -> bool:
            return await stage() == "training"

        await eventually(training)
        if shots is not None:
            await run(lambda: browser.save_screenshot(str(shots / "cycle-live.png")))
        async with store.tenant("acme") as session:
            row = await session.get(Cycle, live_id)
            assert row is not None
            row.state = "completed"

        async def reloaded() -> bool:
            return not await shows("EventSource")

        await eventually(reloaded)
    finally:
        await asyncio.to_thread(browser.quit)
