"""OpenAPI 3.1 documents built from route tables whose bodies are msgspec Structs, so a document
cannot say something the code does not decode or encode. Each HTTP surface keeps its table
beside its routes, serves the document at `/openapi.json`, and tests check the document against
the routes the application really registers (`undocumented`) and against the copy in docs/."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    request: type | None = None
    """The JSON body's Struct, if the route takes one."""
    response: type | None = None
    """The JSON answer's Struct; None for a non-JSON answer (`media`)."""
    media: str = "application/json"
    secured: bool = True
    """Needs the bearer key."""
    body_optional: bool = False
    """Whether the route also takes no body at all (its Struct's defaults)."""


def document(
    title: str, version: str, description: str, routes: tuple[Route, ...], error: type
) -> dict[str, Any]:
    bodies = [t for r in routes for t in (r.request, r.response) if t is not None]
    kinds = list(dict.fromkeys([*bodies, error]))
    refs, components = msgspec.json.schema_components(
        kinds, ref_template="#/components/schemas/{name}"
    )
    for schema in components.values():
        # a Struct's docstring, dedented whichever msgspec built it (0.23 dedents, earlier did not)
        if isinstance(schema.get("description"), str):
            schema["description"] = inspect.cleandoc(schema["description"])
    ref = dict(zip(kinds, refs, strict=True))
    errors = {"content": {"application/json": {"schema": ref[error]}}}
    paths: dict[str, Any] = {}
    for route in routes:
        ok: dict[str, Any] = {"description": "OK"}
        ok["content"] = {
            route.media: {"schema": ref[route.response] if route.response else {"type": "string"}}
        }
        operation: dict[str, Any] = {
            "summary": route.summary,
            "responses": {
                "200": ok,
                "4XX": {"description": "The request was refused", **errors},
                "5XX": {"description": "The server or an upstream failed", **errors},
            },
        }
        if route.request is not None:
            operation["requestBody"] = {
                "required": not route.body_optional,
                "content": {"application/json": {"schema": ref[route.request]}},
            }
        operation["security"] = [{"bearer": []}] if route.secured else []
        paths.setdefault(route.path, {})[route.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def serve(app: web.Application, doc: dict[str, Any]) -> None:
    """Add `GET /openapi.json` (no key needed: it describes, it reveals nothing)."""
    body = msgspec.json.encode(doc)

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/openapi.json", openapi)


def undocumented(app: web.Application, doc: dict[str, Any]) -> list[str]:
    """`METHOD path` of every registered route the document leaves out, and of every documented
    one the application does not register."""
    registered = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    } - {("get", "/openapi.json")}
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    return sorted(f"{m.upper()} {p}" for m, p in registered ^ documented)
