"""schemathesis against the router's own OpenAPI document (issue 14): requests made from the
document, valid ones and ones that break it, with a tenant's key, never get a 5xx. The router
is the real service (NATS, Postgres, its routing) in front of a stand-in model server; the
cases run on a thread of their own while the router serves on the test's loop."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="a dev dependency")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from services.router.openapi import router_openapi  # noqa: E402
from tests.integration.test_router_service import Upstream, router  # noqa: E402, F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("RETRACE_SCHEMA_EXAMPLES", "25"))
"""Examples per route; more for a longer hunt (`RETRACE_SCHEMA_EXAMPLES=500`)."""


AGENT = "bot"
"""The agent the `router` fixture creates: a generated `model` names no agent of the tenant
(a 404 before anything is routed), so three chat cases in four name this one."""


def _naming_the_agent(pair: tuple[Any, bool]) -> Any:
    case, name_it = pair
    if name_it and isinstance(case.body, dict):
        case.body["model"] = AGENT
    return case


def _hunt(url: str, key: str, statuses: set[tuple[str, int, bool]]) -> list[str]:
    """Every route's generated cases against the router; what came back as a 5xx (and in
    `statuses`, each route's answers)."""
    schema = schemathesis.openapi.from_dict(router_openapi())
    found: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        # both kinds, each its own examples: schemathesis makes only valid ones unless asked
        # (issue 14's audit: this test had sent none that break the document), and valid
        # chats drawn among the others were sometimes too few to reach the model server;
        # a route with nothing to break (no body, no parameters) has no invalid requests
        breakable = operation.body or operation.query or operation.path_parameters
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[: 2 if breakable else 1]:
            cases = operation.as_strategy(mode)
            if operation.path == "/v1/chat/completions":
                cases = st.tuples(cases, st.sampled_from((True, True, True, False))).map(
                    _naming_the_agent
                )
            _run(cases, url, key, statuses, found)
    return found


def _run(
    cases: Any, url: str, key: str, statuses: set[tuple[str, int, bool]], found: list[str]
) -> None:
    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = case.call(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        negative = case.meta is not None and case.meta.generation.mode.is_negative
        statuses.add((case.path, response.status_code, negative))
        if response.status_code >= 500:
            found.append(
                f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
                f" (body {str(case.body)[:300]})"
            )

    run()


async def test_no_request_the_document_allows_or_breaks_gets_a_5xx(
    router: tuple[str, str, Upstream, dict[str, uuid.UUID]],  # noqa: F811  (the fixture)
) -> None:
    url, key, upstream, _ = router
    statuses: set[tuple[str, int, bool]] = set()
    assert await asyncio.to_thread(_hunt, url, key, statuses) == []
    assert upstream.models  # valid chats went through to the model server
    # and requests that break the document, refused (a 5xx fails above)
    assert any(
        path == "/v1/chat/completions" and negative and 400 <= status < 500
        for path, status, negative in statuses
    ), statuses
