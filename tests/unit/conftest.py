"""Unit-test fixtures: a fake chat endpoint factory for the LLM callers' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_chat import Serve, serving


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    async for start in serving():
        yield start
