"""Following a cycle survives an API or store that fails for a moment: trace_lift's second
run died 70 minutes in when one snapshot query hit Postgres's statement timeout on a loaded
machine, and took the services (and the cycle's progress) down with it. Through the control
API, a 503 or a connection refused is retried; any other refusal ends the follower."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.cli import improve
from shared.cli.control import ApiError, ApiUnavailable, ControlApi


def _answering(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> None:
    async def snapshot(*_: object) -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    async def no_wait(_: float) -> None:
        return None

    monkeypatch.setattr(improve, "_snapshot", snapshot)
    monkeypatch.setattr(improve.asyncio, "sleep", no_wait)


async def test_a_failed_snapshot_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [
        ApiUnavailable(503, "the store is unavailable, try again"),
        ApiUnavailable(0, "cannot reach the control API at http://127.0.0.1:8090"),
        {"state": "training"},
        {"state": "completed", "reason": "rejected"},
    ]
    _answering(monkeypatch, answers)
    api = ControlApi("http://127.0.0.1:1", {})
    ended = await improve.follow_cycle(api, uuid.uuid4(), wait_s=60)
    assert ended["state"] == "completed" and answers == []


async def test_a_refusal_ends_the_follower_with_the_api_s_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _answering(monkeypatch, [ApiError(404, "no cycle 1234")])
    with pytest.raises(ApiError, match="no cycle 1234"):
        await improve.follow_cycle(ControlApi("http://127.0.0.1:1", {}), uuid.uuid4(), wait_s=60)


async def test_a_start_the_api_could_not_confirm_is_sent_again_with_the_same_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API answers 503 "repeat with the same cycle_id" when the bus did not confirm:
    the CLI does, a few times, and gives up with the API's message."""
    sent: list[tuple[str, str, Any]] = []
    answers: list[Exception | None] = [ApiUnavailable(503, "repeat this request"), None]

    async def call(method: str, path: str, body: object = None) -> Any:
        sent.append((method, path, body))
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return {}

    async def no_wait(_: float) -> None:
        return None

    api = ControlApi("http://127.0.0.1:1", {})
    monkeypatch.setattr(api, "call", call)
    monkeypatch.setattr(improve.asyncio, "sleep", no_wait)
    cycle_id = uuid.uuid4()
    await improve.request_cycle(api, "bot", improve.CycleSettings(), cycle_id)
    assert len(sent) == 2 and sent[0] == sent[1]
    assert sent[0][2]["cycle_id"] == str(cycle_id)  # type: ignore[index]
    answers[:] = [ApiUnavailable(503, "still down")] * 4
    with pytest.raises(ApiUnavailable, match="still down"):
        await improve.request_cycle(api, "bot", improve.CycleSettings(), uuid.uuid4())
