"""Following a cycle survives a store that fails for a moment: trace_lift's second run died
70 minutes in when one snapshot query hit Postgres's statement timeout on a loaded machine,
and took the services (and the cycle's progress) down with it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from shared.cli import improve
from shared.config import ServiceConfig


async def test_a_failed_snapshot_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [
        OperationalError("SELECT", {}, Exception("canceling statement due to statement timeout")),
        {"state": "training"},
        {"state": "completed", "reason": "rejected"},
    ]

    async def snapshot(*_: object) -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    async def no_wait(_: float) -> None:
        return None

    monkeypatch.setattr(improve, "_snapshot", snapshot)
    monkeypatch.setattr(improve.asyncio, "sleep", no_wait)
    ended = await improve.follow_cycle(ServiceConfig(), "default", uuid.uuid4(), wait_s=60)
    assert ended["state"] == "completed" and answers == []
