"""OpenAI-shaped HTTP errors, for every surface that speaks the OpenAI API (the router, the
model server): `{"error": {"message", "type", "param", "code"}}` as JSON, whatever went
wrong, aiohttp's own 404, 405 and 413 included (they are text/plain otherwise)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from shared.llm.openai_types import ErrorBody, ErrorResponse
from shared.logging import get_logger

log = get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
}


def openai_error(
    status: int,
    message: str,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error response in the OpenAI shape; `kind` defaults by status."""
    body = ErrorResponse(
        error=ErrorBody(
            message=message,
            type=kind
            or KINDS.get(status, "invalid_request_error" if status < 500 else "server_error"),
            code=status,
        )
    )
    return web.Response(
        status=status,
        body=msgspec.json.encode(body),
        content_type="application/json",
        headers=headers,
    )


def presented_token(request: web.Request) -> str:
    """The token of the request's `Authorization: Bearer <token>` header ("" without one).
    The scheme is matched whatever its case, as RFC 9110 has it (`bearer` was a 401), and a
    header without it carries no token (a bare key was taken on the model server)."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def bearer_token(request: web.Request) -> bytes:
    """The request's bearer token as bytes, to compare with `hmac.compare_digest`. A header
    that is not UTF-8 (aiohttp keeps its bytes as surrogates) is the bytes it was, so it is a
    wrong key, not a 500 whose traceback names the key."""
    return presented_token(request).encode("utf-8", "surrogateescape")


def carries_key(request: web.Request, key: str) -> bool:
    """Whether the request's bearer token is `key` (compared in constant time)."""
    return hmac.compare_digest(bearer_token(request), key.encode())


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's HTTP errors (no route, wrong method, body too large) as OpenAI-shaped JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.content_type == "application/json":
            raise  # already JSON (a handler's own)
        allow = exc.headers.get("Allow")  # a 405 names the methods it takes (RFC 9110)
        return openai_error(
            exc.status,
            exc.reason if not exc.text else _text(exc),
            headers={"Allow": allow} if allow is not None else None,
        )
    except Exception:
        log.exception("request failed", path=request.path)
        return openai_error(500, "internal error (see the service's log)", "server_error")


def _text(exc: web.HTTPException) -> str:
    text = (exc.text or "").strip()
    prefix = f"{exc.status}: "
    return text.removeprefix(prefix) or exc.reason
