"""The OpenAPI documents published in docs/, by file name; `python -m tests.support.openapi_docs`
writes them (tests/unit/test_openapi_documents.py fails when they drift from the code)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.api.openapi import api_openapi
from services.router.openapi import router_openapi
from shared.envs.remote.wire import openapi as environment_openapi
from shared.serving.openapi import model_gate_openapi, model_server_openapi

DOCUMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "openapi-router.json": router_openapi,
    "openapi-api.json": api_openapi,
    "openapi-model-server.json": model_server_openapi,
    "openapi-model-gate.json": model_gate_openapi,
    "environment-http.json": environment_openapi,
}


def main() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name, build in DOCUMENTS.items():
        (docs / name).write_text(json.dumps(build(), indent=2, sort_keys=True) + "\n", "utf-8")
        print(f"wrote docs/{name}")


if __name__ == "__main__":
    main()
