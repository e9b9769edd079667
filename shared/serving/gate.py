"""`retrace model-gate`: the model server's rules in front of an engine that cannot hold them
itself (vLLM). vLLM has one key for everything, and checks it only on paths under `/v1`: its
`/invocations` (SageMaker's) generates with any served adapter, and `/metrics`, `/tokenize`
and the rest answer anyone who reaches the port. It also loads LoRA from any path it can
read. So vLLM listens where only the gate reaches it, and the gate serves the same API as
`retrace serve-model`, under the same rules (`shared.serving.access`): the services' key on
every route but health, the admin key to load and unload adapters, adapter paths inside the
artifact store, only the routes retrace uses (anything else is a 404 here, never vLLM's).

Bodies pass through as they came, after a check that they are one JSON object naming a
`model`, so vLLM never sees bytes a client could not have meant; replies (streamed ones
included) come back as vLLM wrote them, but a 5xx, which may carry vLLM's internal exception,
is answered with a 502 of our own and its text logged at debug level."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from shared import openapi
from shared.errors import UNDECODABLE
from shared.llm.errors_http import json_errors, openai_error
from shared.llm.openai_types import (
    ErrorBody,
    ErrorResponse,
    LoadAdapterRequest,
    UnloadAdapterRequest,
)
from shared.logging import get_logger, redact
from shared.runtime.deadlines import (
    BODY_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    WRITE_TIMEOUT_S,
    CallerStalled,
    end_within,
    read_body,
    write_within,
)
from shared.runtime.http import listen
from shared.serving.access import Handler, ModelAccess, OutsideStore, weaknesses
from shared.serving.openapi import GateHealth, model_gate_openapi

log = get_logger(__name__)
T = TypeVar("T")

MAX_BODY_BYTES = 4 << 20
"""As `retrace serve-model`'s: more text than any context window served holds."""
SHUTDOWN_GRACE_S = 60.0
"""At SIGTERM, requests in flight (a long generation) get this long to finish."""
CALLER_WRITE_S = WRITE_TIMEOUT_S
"""How long a stream's write waits for its caller to read (then the caller is cut off and the
engine's request closed): one who stopped reading held both for ever."""
PASSED_HEADERS = frozenset({"content-type", "cache-control", "x-request-id"})
"""The headers of the engine's reply that reach the caller: what says how to read the body.
The rest (its server, cookies, its connection's framing) are the engine's own."""


class _Addressed(msgspec.Struct):
    """What the gate checks of a generation request before vLLM sees it: one JSON object
    naming a model (vLLM validates the rest, with the OpenAI error shape), and none of
    vLLM's fields that are the deployment's to set, not one request's (`ENGINE_ONLY`)."""

    model: str
    priority: Any = None
    chat_template: Any = None
    request_id: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    vllm_xargs: Any = None
    chat_template_kwargs: Any = None

    def __post_init__(self) -> None:
        given = [name for name in ENGINE_ONLY if getattr(self, name) not in (None, 0)]
        kwargs = self.chat_template_kwargs
        if isinstance(kwargs, dict) and "chat_template" in kwargs:
            # vLLM reads a template from here too (with --trust-request-chat-template)
            given.append("chat_template_kwargs.chat_template")
        if given:
            raise ValueError(
                f"{', '.join(given)}: set by the deployment, not by a request (one tenant's "
                "request would reach the engine's scheduling, templates or internals)"
            )


ENGINE_ONLY = (
    "priority",
    "chat_template",
    "request_id",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
)
"""vLLM's request fields refused here: `priority` jumps the queue under priority scheduling,
`chat_template` (or one inside `chat_template_kwargs`) has the engine render a caller's
Jinja, `request_id` names the engine's own bookkeeping, and the last three reach its
disaggregated-serving (key/value and encoder caches) and plugin internals."""


@dataclass(frozen=True)
class GateConfig:
    upstream: str
    """The engine's OpenAI base URL (`http://vllm:8000/v1`)."""
    upstream_key: str | None = None
    """The engine's own key (vLLM's `--api-key`), known to the gate alone."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    admin_key: str | None = None
    api_key_file: Path | None = None
    """More keys, one per line, re-read when the file changes (`shared.serving.keys`)."""
    admin_key_file: Path | None = None
    adapter_dirs: tuple[Path, ...] = ()
    """Where adapters may be loaded from (the artifact store); empty: anywhere."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    """Longest silence from the engine within one reply (a stream's next token included)."""
    max_body_bytes: int = MAX_BODY_BYTES
    shutdown_grace_s: float = SHUTDOWN_GRACE_S


class ModelGate:
    def __init__(self, cfg: GateConfig) -> None:
        self.cfg = cfg
        self.access = ModelAccess(
            cfg.api_key,
            cfg.admin_key,
            cfg.adapter_dirs or None,
            api_key_file=cfg.api_key_file,
            admin_key_file=cfg.admin_key_file,
        )
        base = cfg.upstream.rstrip("/")
        self.root = base.removesuffix("/v1")
        """The engine's address without its API prefix (its `/health` lives there)."""
        self._session: aiohttp.ClientSession | None = None
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "retrace_model_gate_requests_total",
            "Requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.upstream_failures = Counter(
            "retrace_model_gate_upstream_failures_total",
            "Requests the engine did not answer, answered with a 5xx, or refused the gate's key",
            ["kind"],
            registry=self.registry,
        )
        self.abandoned = Counter(
            "retrace_model_gate_abandoned_total",
            "Streams whose caller left before their end (the engine's request is then closed)",
            registry=self.registry,
        )

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[json_errors, self.counted, self.access.authorized],
            client_max_size=self.cfg.max_body_bytes,
        )
        app.cleanup_ctx.append(self.access.watching_keys)  # key files re-read when changed
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/load_lora_adapter", self.load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_adapter)
        app.router.add_get("/healthz", self.health)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        openapi.serve(app, model_gate_openapi())
        app.on_cleanup.append(self._close)
        return app

    @property
    def session(self) -> aiohttp.ClientSession:
        """One keep-alive pool to the engine."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.cfg.connect_timeout_s,
                    sock_read=self.cfg.read_timeout_s,
                ),
            )
        return self._session

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @web.middleware
    async def counted(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.requests.labels(route, str(exc.status)).inc()
            raise
        except asyncio.CancelledError:
            # the caller hung up (its handler cancelled): nginx's 499, "client closed"
            self.requests.labels(route, "499").inc()
            raise
        except Exception:
            self.requests.labels(route, "500").inc()  # `json_errors`, outside, answers it
            raise
        self.requests.labels(route, str(response.status)).inc()
        return response

    # -- routes ------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        _, body = await self._decoded(request, _Addressed)
        return await self._forward(request, "POST", body)  # as it came

    async def models(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, "GET", None)

    async def load_adapter(self, request: web.Request) -> web.StreamResponse:
        req, _ = await self._decoded(request, LoadAdapterRequest)
        if not req.lora_name.strip():
            return openai_error(400, "lora_name must not be empty")
        try:
            path = await self.access.adapter_path(req.lora_path)
        except OutsideStore as exc:
            return openai_error(403, exc.message, "permission_error")
        # the engine is given the resolved path the check passed, not the caller's spelling
        checked = LoadAdapterRequest(lora_name=req.lora_name, lora_path=str(path))
        log.info("adapter load forwarded", name=req.lora_name, path=str(path))
        return await self._forward(request, "POST", msgspec.json.encode(checked))

    async def unload_adapter(self, request: web.Request) -> web.StreamResponse:
        req, _ = await self._decoded(request, UnloadAdapterRequest)
        log.info("adapter unload forwarded", name=req.lora_name)
        return await self._forward(request, "POST", msgspec.json.encode(req))

    async def _decoded(self, request: web.Request, kind: type[T]) -> tuple[T, bytes]:
        """The body as `kind`, with its bytes; a 400 saying what is wrong (`json_errors`
        writes it in the OpenAI shape), a 408 when it does not arrive in time."""
        body = await read_body(request, self.cfg.body_timeout_s)
        try:
            return msgspec.json.decode(body, type=kind), body
        except UNDECODABLE as exc:
            raise web.HTTPBadRequest(text=f"invalid request: {exc}") from None

    async def health(self, _: web.Request) -> web.Response:
        """Up when the engine answers its own health check within a few seconds."""
        upstream = False
        try:
            async with self.session.get(
                f"{self.root}/health", timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                upstream = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            upstream = False
        report = GateHealth(status="ok" if upstream else "unavailable", upstream=upstream)
        return web.Response(
            body=msgspec.json.encode(report),
            status=200 if upstream else 503,
            content_type="application/json",
        )

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # -- forwarding --------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.cfg.upstream_key:
            headers["Authorization"] = f"Bearer {self.cfg.upstream_key}"
        return headers

    async def _forward(
        self, request: web.Request, method: str, body: bytes | None
    ) -> web.StreamResponse:
        """The same path on the engine with the engine's key; its reply passed back as it
        came (a stream chunk by chunk), but a 5xx as a 502 of the gate's."""
        url = f"{self.root}{request.path}"
        try:
            upstream = await self.session.request(method, url, data=body, headers=self._headers())
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.upstream_failures.labels("unreachable").inc()
            log.warning("model engine unreachable", path=request.path, error=type(exc).__name__)
            return openai_error(502, "the model engine behind this gate is unreachable")
        async with upstream:
            if upstream.status >= 500:
                return await self._failed(request, upstream)
            if upstream.status in (401, 403):
                # the gate's own key is wrong: the caller's request is not what was refused
                self.upstream_failures.labels("refused_key").inc()
                log.error(
                    "model engine refused the gate's key (RETRACE_MODEL_UPSTREAM_KEY)",
                    path=request.path,
                    status=upstream.status,
                )
                return openai_error(502, "the model engine behind this gate refused it")
            headers = {k: v for k, v in upstream.headers.items() if k.lower() in PASSED_HEADERS}
            if not upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                try:
                    data = await upstream.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self.upstream_failures.labels("broken").inc()
                    log.warning("model engine broke off", path=request.path, error=repr(exc))
                    return openai_error(502, "the model engine broke off its reply")
                return web.Response(status=upstream.status, body=data, headers=headers)
            return await self._stream(request, upstream, headers)

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, headers: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await write_within(request, response, chunk, CALLER_WRITE_S)
            await end_within(request, response, CALLER_WRITE_S)
        except (ConnectionResetError, CallerStalled, asyncio.CancelledError) as exc:
            # the caller left (its handler cancelled, or writing to it raised aiohttp's
            # ClientConnectionResetError) or stopped reading: leaving closes the engine's
            # connection, which stops its generation
            self.abandoned.inc()
            log.debug(
                "caller left a stream", path=request.path, stalled=isinstance(exc, CallerStalled)
            )
            if isinstance(exc, asyncio.CancelledError):
                raise
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as exc:
            self.upstream_failures.labels("broken").inc()
            log.warning("model engine broke off a stream", path=request.path, error=repr(exc))
            failed = ErrorResponse(
                error=ErrorBody(
                    message="the model engine broke off its reply",
                    type="upstream_error",
                    code=502,
                )
            )
            with contextlib.suppress(ConnectionResetError, CallerStalled):
                # after a blank line: the engine may have broken off inside an event
                event = b"\n\ndata: " + msgspec.json.encode(failed) + b"\n\n"
                await write_within(request, response, event, CALLER_WRITE_S)
                await end_within(request, response, CALLER_WRITE_S)
        return response

    async def _failed(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.Response:
        self.upstream_failures.labels(f"status_{upstream.status}").inc()
        try:
            text = (await upstream.read())[:2000].decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError):
            text = ""
        # vLLM's 5xx can carry its exception, built from the request: the text is debug only
        log.warning("model engine failed", path=request.path, status=upstream.status)
        log.debug("model engine failure text", path=request.path, text=text)
        return openai_error(502, f"the model engine behind this gate failed ({upstream.status})")


async def start_gate(cfg: GateConfig, gate: ModelGate | None = None) -> web.AppRunner:
    """The gate (`gate`, else one made of `cfg`) listening on `cfg.host:cfg.port`, as
    `retrace model-gate` runs it."""
    return await listen(
        (gate or ModelGate(cfg)).app(),
        cfg.host,
        cfg.port,
        idle_timeout_s=cfg.idle_timeout_s,
        shutdown_timeout=cfg.shutdown_grace_s,
        cancel_on_disconnect=True,  # a caller gone: its generation is stopped, not finished
    )


async def serve_gate(cfg: GateConfig) -> None:
    """Serve until SIGTERM or SIGINT; requests in flight then get `shutdown_grace_s`."""
    gate = ModelGate(cfg)
    runner = await start_gate(cfg, gate)
    log.info(
        "model gate ready",
        upstream=redact(cfg.upstream),
        host=cfg.host,
        port=cfg.port,
        key_required=cfg.api_key is not None or cfg.api_key_file is not None,
        admin_key_required=cfg.admin_key is not None or cfg.admin_key_file is not None,
        key_files=[str(f) for f in (cfg.api_key_file, cfg.admin_key_file) if f is not None],
        upstream_keyed=cfg.upstream_key is not None,
        adapter_dirs=[str(d) for d in cfg.adapter_dirs] or "anywhere",
    )
    for weakness in weaknesses(gate.access):
        log.warning(f"model gate open: {weakness}", host=cfg.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("model gate stopping")
    await runner.cleanup()
