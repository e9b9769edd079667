"""Each HTTP surface's OpenAPI document matches the routes its application really registers
and the copy published in docs/ (regenerate those with
`python -m tests.support.openapi_docs`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.api.config import ApiConfig
from services.api.service import build as build_api
from services.router.config import RouterConfig
from services.router.service import build as build_router
from shared.envs.remote.server import environment_app
from shared.openapi import Route, document, undocumented
from shared.runtime.http import build_app
from shared.serving.api import ModelServer
from shared.serving.gate import GateConfig, ModelGate
from tests.support.openapi_docs import DOCUMENTS

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_published_documents_match_the_code(name: str) -> None:
    published = json.loads((DOCS / name).read_text(encoding="utf-8"))
    assert published == json.loads(json.dumps(DOCUMENTS[name]())), f"regenerate docs/{name}"


def _router_app() -> web.Application:
    service = build_router(RouterConfig())
    return build_app(service.metrics, service.health, service.routes, None)


def _api_app() -> web.Application:
    service = build_api(ApiConfig())
    return build_app(service.metrics, service.health, service.routes, None)


def _model_server_app() -> web.Application:
    # the routes only: a stand-in for the engine, whose real counterpart the model tests load
    embeddings = SimpleNamespace(num_embeddings=10)
    engine: Any = SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: embeddings))
    return ModelServer(engine, prompts=None, served_name="m", max_context=8, api_key="k").app()  # type: ignore[arg-type]


def _model_gate_app() -> web.Application:
    return ModelGate(GateConfig(upstream="http://127.0.0.1:9/v1", api_key="k")).app()


def _environment_app() -> web.Application:
    from retrace_hotel_desk.env import HotelDesk

    return environment_app(HotelDesk())


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (_router_app, "openapi-router.json"),
        (_api_app, "openapi-api.json"),
        (_model_server_app, "openapi-model-server.json"),
        (_model_gate_app, "openapi-model-gate.json"),
        (_environment_app, "environment-http.json"),
    ],
)
async def test_every_route_is_documented_and_served(make: Any, name: str) -> None:
    app = make()
    doc = DOCUMENTS[name]()
    assert undocumented(app, doc) == []
    if name == "environment-http.json":
        return  # the environment protocol is a contract for other servers, not served itself
    async with TestClient(TestServer(app)) as client:
        served = await client.get("/openapi.json")  # no key: it describes, it reveals nothing
        assert served.status == 200 and await served.json() == json.loads(json.dumps(doc))


class _Described(msgspec.Struct):
    """A body."""

    x: int = 0


def test_a_struct_docstring_is_dedented_whichever_msgspec_builds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # msgspec 0.23 dedents a docstring and earlier versions did not: the published documents
    # must not change with the msgspec that CI happens to install. The indented form is what
    # msgspec 0.22 gives (the pinned one gives the other, which cleandoc leaves as it is).
    built = msgspec.json.schema_components

    def as_022(*args: Any, **kwargs: Any) -> Any:
        refs, components = built(*args, **kwargs)
        components["_Described"]["description"] = "First line, and\n    a second, indented."
        return refs, components

    monkeypatch.setattr(msgspec.json, "schema_components", as_022)
    doc = document("t", "1", "d", (Route("post", "/x", "x", request=_Described),), _Described)
    assert doc["components"]["schemas"]["_Described"]["description"] == (
        "First line, and\na second, indented."
    )
