"""examples/http_pantry: a server written without retrace, in another process, that retrace
runs through the HTTP environment protocol: it passes the conformance checks, and a scripted
clerk's episodes over it earn the reward they should."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.envs.conformance import acheck
from shared.envs.protocol import Message, ToolCall, ToolCallFunction, advance, grade, start
from shared.envs.registry import get_environment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SERVER = Path(__file__).resolve().parents[2] / "examples" / "http_pantry" / "server.py"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield base
    process.terminate()
    process.wait(10)


def _call(tool: str, **arguments: object) -> Message:
    function = ToolCallFunction(name=tool, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id="c", function=function)])


async def test_the_standalone_server_keeps_the_protocol(url: str) -> None:
    tasks = await acheck(get_environment(url), "examples/http_pantry")
    assert len(tasks) == 24 and {t.split for t in tasks} == {"train", "test"}


async def test_episodes_over_http_are_graded_by_the_server(url: str) -> None:
    env = get_environment(url)
    for task in env.tasks()[:6]:
        episode = await start(env, task, 3)
        food, qty = task.data["food"], task.data["quantity"]
        [listed] = (await advance(episode, _call("list_items"))).messages
        have = json.loads(listed.content or "{}").get(food, 0)
        if task.kind == "count":
            await advance(episode, Message(role="assistant", content=f"You have {have} {food}."))
        else:
            tool = "add_item" if task.kind == "add" else "remove_item"
            await advance(episode, _call(tool, name=food, quantity=qty))
            await advance(episode, Message(role="assistant", content="Done."))
        assert (await grade(episode)).success, task.id
    wrong = await start(env, next(t for t in env.tasks() if t.kind == "add"), 0)
    [answer] = (await advance(wrong, _call("add_item", name="apples", quantity=0))).messages
    assert "at least 1" in (answer.content or "")
    assert (await grade(wrong)).reward == 0.0
