"""schemathesis against the model server's own OpenAPI document (issue 14): requests made
from the document, valid ones and ones that break it, never get a 5xx. The server is the real
one (`serving.server.load`, with its key) on a tiny random model, on a real port; the
examples per route are bounded to keep it a CI test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model server needs the train extra")
schemathesis = pytest.importorskip("schemathesis", reason="a dev dependency")

from hypothesis import HealthCheck, settings  # noqa: E402

from shared.serving.openapi import model_server_openapi  # noqa: E402
from shared.serving.server import ServeConfig, load  # noqa: E402
from tests.support.served import on_a_thread  # noqa: E402
from tests.support.tiny_model import save_tiny_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY = "schema-key"
EXAMPLES = int(os.environ.get("RETRACE_SCHEMA_EXAMPLES", "25"))
"""Examples per route; more for a longer hunt (`RETRACE_SCHEMA_EXAMPLES=500`)."""
schema = schemathesis.openapi.from_dict(model_server_openapi())


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The model server on its own loop and thread, as `retrace serve-model` runs it."""
    directory: Path = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    server, engine = load(ServeConfig(model=str(directory), api_key=KEY, max_batch=8))
    engine.start()
    try:
        with on_a_thread(server.app()) as url:
            yield url
    finally:
        engine.stop()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_the_document_allows_or_breaks_gets_a_5xx(case: object, base_url: str) -> None:
    response = case.call(  # type: ignore[attr-defined]
        base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert response.status_code < 500, (case, response.status_code, response.text[:500])
