"""docs/environment-http.json is the HTTP environment protocol's OpenAPI document as the code
defines it (regenerate: python -c "import json; from shared.envs.remote.wire import openapi;
print(json.dumps(openapi(), indent=2, sort_keys=True))" > docs/environment-http.json)."""

from __future__ import annotations

import json
from pathlib import Path

from shared.envs.remote.wire import PREFIX, ROUTES, openapi

DOC = Path(__file__).resolve().parents[2] / "docs" / "environment-http.json"


def test_the_published_document_matches_the_code() -> None:
    assert json.loads(DOC.read_text(encoding="utf-8")) == json.loads(json.dumps(openapi()))


def test_every_route_is_documented_with_its_bodies() -> None:
    paths = openapi()["paths"]
    for method, path, request, response, _ in ROUTES:
        operation = paths[PREFIX + path][method]
        ok = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ok.endswith("/" + response.__name__)
        assert ("requestBody" in operation) == (request is not None)
