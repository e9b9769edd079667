"""Tools from a real MCP server: examples/mcp_notes/server.py (the SDK's own server API),
started as a subprocess for every episode, with tasks and checks from the example's files;
and a rollout through the rollout service on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from sqlalchemy import select

from shared.bus import NatsBus
from shared.config import ServiceConfig
from shared.envs.conformance import acheck
from shared.envs.derived.build import derived_spec
from shared.envs.derived.env import DerivedEnvironment
from shared.envs.derived.simulated import simulate
from shared.envs.mcptools.env import McpEnvironment
from shared.envs.mcptools.judge import JudgeCheckError
from shared.envs.mcptools.spec import McpSpecError
from shared.envs.protocol import Message, ToolCall, ToolCallFunction, advance, close, grade, start
from shared.envs.reference import reference_of
from shared.envs.registry import get_environment
from shared.errors import RetryableError
from shared.store import Store
from shared.store.agents import create_agent
from shared.store.models import Trajectory
from shared.store.tenants import create_tenant
from tests.integration.test_rollout_service import completed, requested, rollout_cfg
from tests.integration.test_rollout_service import start as start_service
from tests.support.fake_chat import FakeJudge, script
from tests.support.oracle_llm import OracleLLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_notes"
REF = f"mcp:{EXAMPLE / 'env.yaml'}"


def _call(name: str, arguments: str) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id="c", function=ToolCallFunction(name=name, arguments=arguments))],
    )


async def test_references_through_a_real_mcp_server_earn_full_reward() -> None:
    env = get_environment(REF)
    assert isinstance(env, McpEnvironment)
    for task in env.tasks():
        episode = await start(env, task, 0)
        try:
            names = [t["function"]["name"] for t in episode.tools]
            assert names == ["search_notes", "read_note", "add_note", "delete_note"]
            for message in reference_of(task) or []:
                if (await advance(episode, message)).done:
                    break
            score = await grade(episode)
        finally:
            await close(episode)
        assert score.success, (task.id, score)


async def test_each_episode_gets_a_fresh_server() -> None:
    env = get_environment(REF)
    task = next(t for t in env.tasks() if t.id == "add-packing")
    first = await start(env, task, 0)
    await advance(first, _call("add_note", json.dumps({"title": "Packing", "body": "x"})))
    await close(first)
    second = await start(env, task, 0)
    try:
        [found] = (await advance(second, _call("search_notes", '{"query": "packing"}'))).messages
    finally:
        await close(second)
    assert json.loads(found.content or "") == {"result": []}  # no note in a fresh server


async def test_bad_calls_and_tool_errors_come_back_to_the_agent() -> None:
    env = get_environment(REF)
    task = next(t for t in env.tasks() if t.id == "delete-dentist")
    episode = await start(env, task, 0)
    try:
        answers = [
            (await advance(episode, _call(name, arguments))).messages[0].content or ""
            for name, arguments in [
                ("shred_note", "{}"),
                ("delete_note", "{not json"),
                ("delete_note", '{"note_id": 99}'),
                ("add_note", '{"title": " ", "body": ""}'),
            ]
        ]
        score = await grade(episode)
    finally:
        await close(episode)
    assert "unknown tool 'shred_note'" in answers[0]
    assert "not valid JSON" in answers[1]
    assert "no note 99" in answers[2]
    assert "needs a title" in answers[3]
    assert all("error" in json.loads(a) for a in answers)
    # a refused add_note still counts as calling it: the not_called check fails too
    assert score.reward == 0.0 and score.notes == [
        "failed 0:called:delete_note",
        "failed 1:not_called:add_note",
    ]


async def test_the_environment_passes_the_conformance_checks() -> None:
    tasks = await acheck(get_environment(REF), "an MCP file")
    assert {t.split for t in tasks} == {"train", "test"}


async def test_a_server_that_will_not_start_is_retryable(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text(
        (EXAMPLE / "tasks.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "env.yaml").write_text(
        "name: x\nserver: {command: /nonexistent/mcp-server}\ntasks: tasks.jsonl\n",
        encoding="utf-8",
    )
    env = McpEnvironment.from_ref(f"mcp:{tmp_path / 'env.yaml'}")
    with pytest.raises(RetryableError, match="did not start"):
        await start(env, env.tasks()[0], 0)


@pytest.mark.parametrize(
    ("yaml_text", "tasks", "problem"),
    [
        ("name: x\nserver: {}\ntasks: t.jsonl\n", None, "needs a command or a url"),
        ("name: x\nserver: {command: a, url: b}\ntasks: t.jsonl\n", None, "not both"),
        ("name: x\nserver: {command: a}\ntasks: t.jsonl\nbogus: 1\n", None, "bogus"),
        (
            "name: x\nserver: {command: a}\ntasks: t.jsonl\n",
            '{"id": "a", "split": "train", "prompt": "p", "checks": [{"kind": "called"}]}\n',
            "task 'a': a 'called' check names its tool",
        ),
        (
            "name: x\nserver: {command: a}\ntasks: t.jsonl\n",
            '{"id": "a", "split": "train", "prompt": "p"}\n',
            "task 'a' needs a non-empty list of checks",
        ),
    ],
)
def test_a_bad_environment_file_says_what_is_wrong(
    tmp_path: Path, yaml_text: str, tasks: str | None, problem: str
) -> None:
    (tmp_path / "env.yaml").write_text(yaml_text, encoding="utf-8")
    (tmp_path / "t.jsonl").write_text(
        tasks or '{"id": "a", "split": "train", "prompt": "p", "checks": []}\n', encoding="utf-8"
    )
    with pytest.raises(McpSpecError, match=problem):
        McpEnvironment.from_ref(f"mcp:{tmp_path / 'env.yaml'}")


async def test_the_rollout_service_runs_an_mcp_environment(
    service_cfg: ServiceConfig, store: Store
) -> None:
    env = get_environment(REF)
    oracle = TestServer(OracleLLM(env).app())
    await oracle.start_server()
    async with store.cross_tenant() as session:
        await create_tenant(session, "acme")
    async with store.tenant("acme") as session:
        agent = await create_agent(session, "notes", model="oracle", environment=REF)
    service, run = await start_service(
        rollout_cfg(service_cfg, f"http://127.0.0.1:{oracle.port}/v1")
    )
    bus = await NatsBus.connect(service_cfg.nats.url or "", service_cfg.nats)
    chosen = [t.id for t in env.tasks() if t.split == "train"][:4]
    request_id = await requested(bus, agent.id, REF, within=90, task_ids=chosen)
    [event] = await completed(bus, request_id)
    assert (event.trajectories, event.successes, event.env_errors) == (4, 4, 0)
    async with store.tenant("acme") as session:
        rows = list(
            await session.scalars(select(Trajectory).where(Trajectory.request_id == request_id))
        )
    assert all(r.success for r in rows)
    service.stop()
    assert await run == 0
    await bus.close()
    await oracle.close()


async def test_references_replay_asynchronously_for_the_diagnosis() -> None:
    """Contrast replays references as successful examples; an MCP environment has no
    synchronous reset, so its references go through `areplay` (and each server is closed)."""
    from shared.envs.reference import areplay

    env = get_environment(REF)
    results = [await areplay(env, task) for task in env.tasks()[:3]]
    assert all(r is not None and r.score.success for r in results)


async def test_a_capability_on_mcp_tools_trains_on_their_schemas_with_simulated_results() -> None:
    """Synthesis for an MCP target: each chosen task's opening (the server's own tool schemas
    included) is taken once from a real server; the derived environment then plays it with
    simulated results and needs no server."""
    env = get_environment(REF)
    train = [t.id for t in env.tasks() if t.split == "train"]
    spec = await simulate(
        derived_spec(REF, "valid_tool_arguments", "", train[:2], train), env, seed=0
    )
    assert spec.simulated is not None and len(spec.simulated) == 2
    served = await start(env, env.tasks()[0], 0)
    try:
        assert spec.simulated[0].tools == served.tools
    finally:
        await close(served)
    derived = DerivedEnvironment(spec, None)
    episode = derived.reset(derived.tasks()[0], 1)
    result = episode.step(_call("search_notes", json.dumps({"query": "rent"})))
    assert json.loads(result.messages[0].content or "")["simulated"] is True
    assert episode.score().reward == 1.0


def _judged_env(tmp_path: Path, judge_url: str | None) -> McpEnvironment:
    """The notes server with one task graded by a `called` check and a `judge` check."""
    row = {
        "id": "wifi",
        "split": "train",
        "prompt": "What's the wifi password? It's somewhere in my notes.",
        "checks": [
            {"kind": "called", "tool": "read_note", "arguments": {"note_id": 3}},
            {"kind": "judge", "text": "The reply tells the user the wifi password.", "weight": 2},
        ],
    }
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    judge = f"judge: {{model: grader, url: '{judge_url}'}}\n" if judge_url else ""
    (tmp_path / "env.yaml").write_text(
        f"name: judged\nserver: {{command: {sys.executable}, args: [{EXAMPLE / 'server.py'}], "
        f"cwd: {EXAMPLE}}}\ntasks: tasks.jsonl\n{judge}",
        encoding="utf-8",
    )
    return McpEnvironment.from_ref(f"mcp:{tmp_path / 'env.yaml'}")


async def _play_wifi(env: McpEnvironment) -> Any:
    episode = await start(env, env.tasks()[0], 0)
    try:
        await advance(episode, _call("read_note", json.dumps({"note_id": 3})))
        await advance(episode, Message(role="assistant", content="It is cobalt-42."))
        return await grade(episode)
    finally:
        await close(episode)


async def test_a_judge_check_is_graded_by_the_configured_model(tmp_path: Path) -> None:
    fake = FakeJudge(script('{"passed": true, "reason": "the reply gives the password"}'))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    server = TestServer(app)
    await server.start_server()
    try:
        score = await _play_wifi(_judged_env(tmp_path, f"http://127.0.0.1:{server.port}/v1"))
    finally:
        await server.close()
    assert score.success and score.reward == 1.0
    assert score.breakdown["1:judge"] == 2.0
    assert any("the reply gives the password" in n for n in score.notes)
    [asked] = fake.requests
    shown = asked["messages"][1]["content"]
    assert asked["model"] == "grader" and "wifi password" in shown
    assert "read_note" in shown and "cobalt-42" in shown and "Criterion:" in shown


async def test_a_judge_that_never_answers_usably_fails_the_scoring_quoting_it(
    tmp_path: Path,
) -> None:
    fake = FakeJudge(script("I think it passed", '{"verdict": "yes"}', "sure"))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    server = TestServer(app)
    await server.start_server()
    try:
        with pytest.raises(JudgeCheckError, match="sure"):
            await _play_wifi(_judged_env(tmp_path, f"http://127.0.0.1:{server.port}/v1"))
    finally:
        await server.close()
    assert len(fake.requests) == 3


def test_a_judge_check_without_a_judge_is_refused_when_the_environment_loads(
    tmp_path: Path,
) -> None:
    with pytest.raises(McpSpecError, match="names no judge"):
        _judged_env(tmp_path, None)
