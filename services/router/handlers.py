"""The router's HTTP side: an OpenAI-compatible chat endpoint per tenant and agent.

POST /v1/chat/completions (`Authorization: Bearer <tenant key>`, `model` = the agent's name):
the first turn of a conversation is routed once (see routing.py) to one of the agent's
production adapters or to the base model; every turn is forwarded to the inference endpoint
with `model` set accordingly (streaming relayed as it comes), and the conversation is kept
as a production trajectory. POST /v1/feedback reports a conversation's outcome. GET
/v1/models lists the tenant's agents. Errors are OpenAI-shaped JSON with a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import select

from services.router.config import RouterConfig
from services.router.conversations import History, Known, Recent
from services.router.keys import KeyIndex
from services.router.limits import Budget, SpendingExchange, TenantLimits
from services.router.recorder import Answered, Opening, Recorder, Turn
from services.router.spool import Spool
from services.router.upstream import Upstream, UpstreamBusyError, UpstreamError
from shared import embeddings
from shared.errors import UNDECODABLE, PermanentError
from shared.llm.adapters import Served
from shared.llm.client import LLMClient, LLMError
from shared.llm.errors_http import json_errors, openai_error, presented_token
from shared.llm.openai_types import MAX_N, ChatRequest, ErrorBody, ErrorResponse
from shared.logging import get_logger
from shared.routing import pack as routing_pack
from shared.routing.modes import (
    BaseOnly,
    Candidate,
    ClassifierRouting,
    Decision,
    EmbeddingRouting,
    Example,
    LearnedRouting,
    RoutingMode,
    embedding_routing,
)
from shared.routing.profiles import first_user_text, profiles
from shared.runtime.deadlines import (
    WRITE_TIMEOUT_S,
    CallerStalled,
    end_within,
    read_body,
    write_within,
)
from shared.runtime.service import Service
from shared.store import quotas
from shared.store.agents import AgentNotFoundError, get_agent
from shared.store.changes import ChangeFeed, RowCache, asyncpg_dsn
from shared.store.engine import STORE_ERRORS, not_the_store
from shared.store.models import Adapter, Agent, Conversation, Trajectory
from shared.store.tenants import hash_key, live_key_and_quotas, scope_refusal, well_formed

log = get_logger(__name__)
CONVERSATION_HEADER = "X-Retrace-Conversation"
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
"""A chat request's top-level fields, each kept as the caller's bytes: the router changes
only `model`, and re-encoding a long history cost the event loop as much as reading it."""
ADAPTER_HEADER = "X-Retrace-Adapter"


class Feedback(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    conversation_id: uuid.UUID
    reward: float | None = None
    success: bool | None = None


def error(
    status: int, message: str, kind: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    """An OpenAI-shaped error; a 503 says when to try again (`Retry-After`)."""
    if status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_S), **(headers or {})}
    return openai_error(status, message, kind, headers=headers)


RETRY_AFTER_S = 2
FEEDBACK_WAIT_S = 5.0
"""How long feedback waits for the turns already answered to be written."""


@web.middleware
async def _store_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A store that cannot be reached is the service's fault, not the caller's: 503, said
    plainly, whatever the request was (never a 404 or a bare 500)."""
    try:
        return await handler(request)
    except STORE_ERRORS as exc:
        if not_the_store(exc):
            raise
        log.warning("store unavailable", path=request.path, error=repr(exc))
        return error(503, "the store is unavailable, try again", "service_unavailable")


API_KEY_ID = web.RequestKey("api_key_id", uuid.UUID)
"""The request's key (its row id), for scoping conversations to the caller."""
TOKENS_PER_MIN = web.RequestKey("tokens_per_min", int)
"""The tokens a minute the request's tenant may use (absent: no limit)."""


@dataclass(frozen=True)
class KeyView:
    """A live API key, as the router keeps it: its row and tenant, and the tenant's request
    rate and burst and tokens a minute (its quotas, else the router's; None: no limit), and
    its scope."""

    id: uuid.UUID
    tenant: str
    scope: str
    rate: float | None = None
    burst: int = 1
    tokens_per_min: int | None = None


@dataclass(frozen=True)
class AgentView:
    """What the router reads of an agent, kept in memory between requests."""

    id: uuid.UUID
    name: str
    model: str
    config: dict[str, Any]
    production_adapters: tuple[str, ...]

    @classmethod
    def of(cls, agent: Agent) -> AgentView:
        return cls(
            agent.id,
            agent.name,
            agent.model,
            dict(agent.config or {}),
            tuple(str(a) for a in agent.production_adapters or []),
        )


class RouterApp:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.service: Service | None = None
        self._chats = 0
        """Chat requests in progress (one alone: routing embeds its query on the loop)."""
        self.client = LLMClient.for_endpoint(cfg.model)
        self.served = Served(self.client)
        self.mode: RoutingMode
        if cfg.mode in ("embedding", "learned") and not embeddings.routable(cfg.embedder):
            # as the evaluator scores it: no model, and no routing pack where the embedder
            # needs only tables (compose's image has one)
            log.warning(
                "routing off: the embedding model is not installed (pip install "
                "'retrace[train]')"
                + (
                    f" and no routing pack is configured ({routing_pack.ENV})"
                    if cfg.embedder in embeddings.TABLES_ONLY
                    else ""
                )
                + "; every conversation goes to the base model",
                mode=cfg.mode,
                embedder=cfg.embedder,
            )
            self.mode = BaseOnly()
        elif cfg.mode in ("embedding", "learned"):
            self.mode = embedding_routing(
                cfg.embedder, cfg.min_confidence, alone=lambda: self._chats <= 1
            )
        elif cfg.mode == "classifier":
            self.mode = ClassifierRouting(self.client, cfg.classifier_model, cfg.min_confidence)
        else:
            self.mode = BaseOnly()
        self.upstream = cfg.model.url.rstrip("/")
        if not self.upstream.endswith("/v1"):
            self.upstream += "/v1"
        self.relay = Upstream(
            self.upstream,
            headers={"Authorization": f"Bearer {cfg.model.api_key}"},
            timeout=cfg.model.request_timeout,
            limit=cfg.upstream_connections,
        )
        """The chat requests' way to the model server, with its key (`RETRACE_MODEL_API_KEY`)
        on every request, as the model client sends it."""
        self.spool = Spool(
            Path(cfg.spool_dir).expanduser()
            if cfg.spool_dir
            else cfg.storage.data_path / "spool" / "router"
        )
        self.recorder: Recorder | None = None
        """Writes answered turns (started with the service, which has the store)."""
        self.recent = Recent(cfg.recent_conversations)
        self.limits = TenantLimits()
        self.key_lookups = Budget(cfg.key_lookups_per_s, cfg.key_lookup_burst)
        self._running: dict[str, int] = {}
        """Each tenant's chat requests in progress (`tenant_concurrency`)."""
        self.key_index: KeyIndex | None = None
        """The live keys' hashes: a key here is looked up without spending `key_lookups`
        (started with the service, which has the store)."""
        self.exchange: SpendingExchange | None = None
        """Shares `limits` with the deployment's other router processes (started with the
        service, which has the store's address)."""
        self.token_limits = TenantLimits()
        """Each tenant's tokens a minute (`tokens_per_min`), as `limits` its requests."""
        self.token_exchange: SpendingExchange | None = None
        self._profiles: dict[
            tuple[str, uuid.UUID, tuple[str, ...]], tuple[float, list[Candidate]]
        ] = {}
        self._feed: ChangeFeed | None = None
        self.keys: RowCache[str, KeyView] | None = None
        """Live keys by the hash of the presented key."""
        self.agents: RowCache[tuple[str, str], AgentView] | None = None
        """Agents by (tenant, name)."""
        self.adapters: RowCache[uuid.UUID, tuple[str, str | None]] | None = None
        """An adapter's name and artifact by its id."""
        self.route_seconds: Histogram | None = None
        self.routed: Counter | None = None

    def attach(self, service: Service) -> None:
        self.service = service
        registry = service.metrics.registry
        self.route_seconds = Histogram(
            "retrace_router_route_seconds",
            "Time the router adds to a request before forwarding it (routing and lookups)",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        Gauge(
            "retrace_router_turns_waiting",
            "Turns answered and not yet written to the store (the router refuses requests at "
            "RETRACE_ROUTER_UNRECORDED_LIMIT)",
            registry=registry,
        ).set_function(lambda: self.recorder.waiting if self.recorder is not None else 0)
        Gauge(
            "retrace_router_keys_indexed",
            "Live API keys this router knows by their hashes (looked up without spending "
            "RETRACE_ROUTER_KEY_LOOKUPS_PER_S)",
            registry=registry,
        ).set_function(lambda: len(self.key_index) if self.key_index is not None else 0)
        self.routed = Counter(
            "retrace_router_requests_total",
            "Requests forwarded, by target (adapter or base) and outcome",
            ["target", "outcome"],
            registry=registry,
        )

    def routes(self, app: web.Application) -> None:
        app.middlewares.extend([json_errors, _store_unavailable])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/feedback", self.feedback)
        app.router.add_get("/v1/models", self.models)
        # imported here: the document is built from this module's Structs (Feedback)
        from services.router.openapi import router_openapi
        from shared.openapi import serve

        serve(app, router_openapi())

    async def close(self, _: Service) -> None:
        if self._feed is not None:
            await self._feed.close()
        if self.key_index is not None:
            await self.key_index.close()
        for exchange in (self.exchange, self.token_exchange):
            if exchange is not None:
                await exchange.close()
        if self.recorder is not None:  # what was answered is written first, if it can be
            await self.recorder.close(self.cfg.consumer.shutdown_grace)
        await self.client.close()
        await self.relay.close()

    # -- requests ----------------------------------------------------------------------------

    async def _tenant(self, request: web.Request) -> str | web.Response:
        presented = presented_token(request)
        if not presented:
            return error(401, "missing bearer token (a tenant API key)", "authentication_error")
        if not well_formed(presented):  # no key of ours: refused without a lookup
            return error(401, "unknown or revoked API key", "authentication_error")
        key = await self._key(presented)
        if isinstance(key, web.Response):
            return key
        if key is None:
            return error(401, "unknown or revoked API key", "authentication_error")
        why = scope_refusal(key.scope, "router")
        if why is not None:
            return error(403, why, "permission_error")
        tenant = key.tenant
        request[API_KEY_ID] = key.id
        if key.tokens_per_min is not None:
            request[TOKENS_PER_MIN] = key.tokens_per_min
        if key.rate is not None:
            wait_s = self.limits.take(tenant, key.rate, key.burst)
            if wait_s > 0:
                if self.routed is not None:
                    self.routed.labels("-", "rate_limited").inc()
                return error(
                    429,
                    f"rate limit: {key.rate:g} requests a second for this tenant",
                    headers={"Retry-After": TenantLimits.retry_after(wait_s)},
                )
        return tenant

    async def _key(self, presented: str) -> KeyView | web.Response | None:
        """The live key presented (from memory when it can be), or None; a 503 when this
        process has looked up too many keys it did not hold lately (`key_lookups_per_s`),
        none of them in the live keys' index (`key_index_s`)."""
        hashed = hash_key(presented)
        now = time.monotonic()
        if self.keys is not None and (cached := self.keys.get(hashed, now)) is not None:
            return cached
        indexed = self.key_index is not None and hashed in self.key_index
        wait_s = 0.0 if indexed else self.key_lookups.take()
        if wait_s > 0:
            if self.routed is not None:
                self.routed.labels("-", "key_lookups_shed").inc()
            return error(
                503,
                "too many keys this router does not know were presented at once; try again",
                headers={"Retry-After": TenantLimits.retry_after(wait_s)},
            )
        generation = self._generation()
        assert self.service is not None and self.service.store is not None
        async with self.service.store.cross_tenant() as session:
            found = await live_key_and_quotas(session, presented)
        if found is None:
            return None  # not cached: a key issued a moment later must work at once
        row, stored = found
        try:
            own = quotas.parse(stored)
        except PermanentError as exc:  # set wrong by hand: the router's own limit holds
            log.warning("a tenant's quotas are invalid", tenant=row.tenant_id, error=str(exc))
            own = quotas.Quotas()
        rate = own.requests_per_s or self.cfg.tenant_rate
        burst = own.request_burst or self.cfg.tenant_burst
        tokens = own.tokens_per_min or self.cfg.tenant_tokens_per_min
        key = KeyView(row.id, row.tenant_id, row.scope, rate, burst, tokens)
        if self.key_index is not None:
            self.key_index.found(hashed)
        if self.keys is not None:
            rows = (("api_keys", str(row.id)), ("tenants", row.tenant_id))
            self.keys.put(hashed, key, rows, generation, now)
        return key

    def _over_tokens(self, tenant: str, per_min: int, cost: int) -> web.Response | None:
        """A 429 when the tenant's tokens a minute cannot take `cost` now, else None (and
        the tokens are spent)."""
        headers = None  # no wait lets a request larger than a minute's worth through
        if cost > per_min:
            message = (
                f"request too large for this tenant's {per_min} tokens a minute: it counts "
                f"{cost} (its prompt's characters / 4 plus n x max_tokens); ask for fewer "
                "max_tokens"
            )
        else:
            wait_s = self.token_limits.take(tenant, per_min / 60, per_min, cost)
            if wait_s <= 0:
                return None
            message = (
                f"token rate limit: {per_min} tokens a minute for this tenant (this request "
                f"counts {cost})"
            )
            headers = {"Retry-After": TenantLimits.retry_after(wait_s)}
        if self.routed is not None:
            self.routed.labels("-", "token_rate_limited").inc()
        return error(429, message, headers=headers)

    async def _authorized(self, request: web.Request) -> tuple[str, bytes] | web.Response:
        """The caller's tenant and the request body, or the error response."""
        tenant = await self._tenant(request)
        if isinstance(tenant, web.Response):
            return tenant
        raw = await self._body(request)
        if isinstance(raw, web.Response):
            return raw
        return tenant, raw

    async def _body(self, request: web.Request) -> bytes | web.Response:
        if (request.content_length or 0) > self.cfg.max_body_bytes:
            return error(413, f"body larger than {self.cfg.max_body_bytes} bytes")
        # a chunked body past the limit is aiohttp's 413: the app's limit is max_body_bytes
        return await read_body(request, self.cfg.http.body_timeout_s)

    async def models(self, request: web.Request) -> web.Response:
        tenant = await self._tenant(request)
        if isinstance(tenant, web.Response):
            return tenant
        assert self.service is not None and self.service.store is not None
        async with self.service.store.tenant(tenant) as session:
            agents = list(await session.scalars(select(Agent).order_by(Agent.name)))
        data = [{"id": a.name, "object": "model", "owned_by": tenant} for a in agents]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        self._chats += 1
        try:
            authorized = await self._authorized(request)
            if isinstance(authorized, web.Response):
                return authorized
            tenant = authorized[0]
            cap = self.cfg.tenant_concurrency
            running = self._running.get(tenant, 0)
            if cap is not None and running >= cap:
                if self.routed is not None:
                    self.routed.labels("-", "tenant_concurrency").inc()
                return error(
                    429,
                    f"too many requests in progress: {cap} at once for this tenant",
                    headers={"Retry-After": "1"},
                )
            recorder = self.recorder
            if recorder is not None and not recorder.reserve():
                # the store is behind by `unrecorded_limit` turns: refused before a reply
                # is made, since its turn could not be kept
                if self.routed is not None:
                    self.routed.labels("-", "recorder_full").inc()
                log.warning("request refused: turns wait for the store", waiting=recorder.waiting)
                return error(503, "too many answered turns wait to be recorded; try again")
            self._running[tenant] = running + 1
            try:
                return await self._chat(request, authorized, started)
            finally:
                if recorder is not None:
                    recorder.release()
                if (left := self._running[tenant] - 1) > 0:
                    self._running[tenant] = left
                else:
                    del self._running[tenant]
        finally:
            self._chats -= 1

    async def _chat(
        self, request: web.Request, authorized: tuple[str, bytes], started: float
    ) -> web.StreamResponse:
        tenant, raw = authorized
        try:
            req = msgspec.json.decode(raw, type=ChatRequest)
            body = _FIELDS.decode(raw)  # passed on as the caller sent it
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            # bad JSON or UTF-8, a field of the wrong shape, nesting too deep to read
            return error(400, f"invalid chat request: {str(exc)[:500]}")
        if not req.messages:
            return error(400, "messages must not be empty")
        if not 1 <= req.n <= MAX_N:
            return error(400, f"n must be between 1 and {MAX_N}, not {req.n}")
        cap = self.cfg.max_request_tokens
        # the larger of the two: an endpoint may read either when both are sent
        asked = max((m for m in (req.max_tokens, req.max_completion_tokens) if m), default=None)
        if cap is not None and asked is None:
            asked = max(1, cap // req.n)  # what each choice is sent with
            body["max_tokens"] = msgspec.Raw(b"%d" % asked)
        elif cap is not None and asked is not None and asked * req.n > cap:
            return error(
                400,
                f"n x max_tokens asks for {asked * req.n} tokens; this router allows {cap} a "
                "request",
            )
        per_min = request.get(TOKENS_PER_MIN)
        if per_min is not None:
            refused = self._over_tokens(tenant, per_min, len(raw) // 4 + req.n * (asked or 0))
            if refused is not None:
                return refused
        messages = [msgspec.to_builtins(m) for m in req.messages]
        assert self.service is not None and self.service.store is not None
        # Short transactions, none held across a model or endpoint call, and none at all when
        # memory knows the agent and the conversation: look the agent and conversation up
        # (and a known conversation's target); route a new conversation (an embedding or a
        # classifier request): its row is written with its first turn, after the reply;
        # then make sure the endpoint serves the target.
        now = time.monotonic()
        agent = self.agents.get((tenant, req.model), now) if self.agents is not None else None
        history = History(messages)
        tips = history.tips
        longest = tips[0][1] if tips else None
        key_id = request.get(API_KEY_ID)
        named = _conversation_named(request)
        if isinstance(named, web.Response):
            return named
        known = None
        diverged = False
        if agent is not None:
            known = self.recent.find(agent.id, key_id, named, longest)
        if agent is None or (known is None and (tips or named)):
            generation = self._generation()
            async with self.service.store.tenant(tenant) as session:
                if agent is None:
                    try:
                        agent = AgentView.of(await get_agent(session, req.model))
                    except AgentNotFoundError:
                        return error(
                            404, f"no agent {req.model!r} for this tenant (GET /v1/models)"
                        )
                    if self.agents is not None:
                        rows = (("agents", str(agent.id)),)
                        self.agents.put((tenant, req.model), agent, rows, generation, now)
                    known = self.recent.find(agent.id, key_id, named, longest)
                if known is None and (tips or named):
                    row = await self._find(session, agent, key_id, named, tips)
                    if row is not None:
                        known = self.recent.remember(_known(row))
                        # named, its history need not be the conversation's: a stale retry,
                        # or an earlier turn edited, goes on as a branch of it (below)
                        diverged = row.tip not in {h for _, h in tips}
        if known is None and named is not None:
            # not in this process's memory nor (yet) in the store: another router process
            # may have answered it and not written it yet, or it was lost; a new
            # conversation, whose id the reply's header gives
            log.info("named conversation not found; a new one opened", named=str(named))
        if known is None:
            decision = await self._route(agent, tenant, first_user_text(messages))
            opening = Opening(
                agent_id=agent.id,
                adapter_id=decision.adapter.adapter_id if decision.adapter else None,
                api_key_id=key_id,
                route=decision.record(),
            )
            new = Known(uuid.uuid4(), agent.id, key_id, opening.adapter_id, opening.route, "", 0)
            turn = Turn(tenant, self.recent.remember(new), "", 0, opening=opening)
            target, artifact = await self._served_by(tenant, agent, opening.adapter_id)
        elif diverged:
            # found where the conversation is not: `_answered` then makes the turn a branch
            # (its own conversation, the same route), so the history kept is not replaced
            turn = Turn(tenant, known, longest or "", len(tips))
            target, artifact = await self._served_by(tenant, agent, known.adapter_id)
        else:
            turn = Turn(tenant, known, known.tip, known.turns)
            target, artifact = await self._served_by(tenant, agent, known.adapter_id)
        try:  # an endpoint that restarted has forgotten its adapters: load it again (its
            # list of models is kept 10 s, so this costs a continued turn nothing)
            await self.served.ensure(target, artifact)
        except (PermanentError, LLMError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("target not served", target=target, error=repr(exc))
            return error(
                502,
                f"the inference endpoint cannot serve {target!r}; try again",
                "upstream_error",
                {ADAPTER_HEADER: target},
            )
        if self.route_seconds is not None:
            self.route_seconds.observe(time.perf_counter() - started)
        body["model"] = msgspec.Raw(msgspec.json.encode(target))
        headers = {CONVERSATION_HEADER: str(turn.conversation_id), ADAPTER_HEADER: target}
        if req.stream:
            return await self._relay_stream(request, turn, body, history, headers)
        return await self._relay(turn, body, history, headers)

    async def _find(
        self,
        session: Any,
        agent: AgentView,
        key_id: uuid.UUID | None,
        named: uuid.UUID | None,
        tips: Sequence[tuple[int, str]],
    ) -> Conversation | None:
        """The conversation the request continues, read from the store: the one it names,
        else the one whose tip is the longest prefix of its history (`tips`), among the
        caller's key's."""
        if named is not None:
            found = await session.get(Conversation, named)
            if found is not None and found.agent_id == agent.id:
                return found
        if not tips:
            return None
        # the history hash is a fallback, and only within the caller's own key: two users
        # who open alike must not share a conversation on their second turn
        rows = list(
            await session.scalars(
                select(Conversation).where(
                    Conversation.agent_id == agent.id,
                    Conversation.api_key_id == key_id,
                    Conversation.tip.in_([h for _, h in tips]),
                )
            )
        )
        by_tip = {row.tip: row for row in rows}
        for _, h in tips:  # longest prefix first
            if h in by_tip:
                return by_tip[h]
        return None

    async def _served_by(
        self,
        tenant: str,
        agent: AgentView,
        adapter_id: uuid.UUID | None,
    ) -> tuple[str, str | None]:
        """The model name an adapter is served as, and its artifact: from memory, else read
        in a transaction of `tenant`'s. The base model for none (or one deleted since)."""
        if adapter_id is None:
            return agent.model, None
        now = time.monotonic()
        if self.adapters is not None:
            cached = self.adapters.get(adapter_id, now)
            if cached is not None:
                return cached
        generation = self._generation()
        assert self.service is not None and self.service.store is not None
        async with self.service.store.tenant(tenant) as session:
            adapter = await session.get(Adapter, adapter_id)
        if adapter is None:
            return agent.model, None
        served = (adapter.name, adapter.artifact_uri)
        if self.adapters is not None:
            rows = (("adapters", str(adapter.id)),)
            self.adapters.put(adapter.id, served, rows, generation, now)
        return served

    async def _route(self, agent: AgentView, tenant: str, text: str) -> Decision:
        """The routing decision; a classifier that cannot answer sends the conversation to
        the base model (the fallback every mode has) rather than failing the request."""
        mode = self._mode_for(agent)
        candidates = await self._candidates(tenant, agent)
        try:
            return await mode.decide(text, candidates)
        except (LLMError, PermanentError, aiohttp.ClientError, TimeoutError) as exc:
            # the error's text can quote the request (an endpoint's refusal): at debug only
            log.warning(
                "routing failed; the base model serves", mode=mode.name, error=type(exc).__name__
            )
            log.debug("routing failure", mode=mode.name, error=repr(exc))
            return Decision(None, 0.0, f"{mode.name}:unavailable")

    def _mode_for(self, agent: AgentView) -> RoutingMode:
        """The configured mode; `learned` uses the examples the agent's last promoting cycle
        left in its config (embedding routing until there are some)."""
        examples = ((agent.config or {}).get("router") or {}).get("examples") or []
        if (
            self.cfg.mode != "learned"
            or not examples
            or not isinstance(self.mode, EmbeddingRouting)
        ):
            return self.mode
        return LearnedRouting(
            self.mode.exact,
            [Example(str(e["text"]), e.get("adapter")) for e in examples],
            self.cfg.min_confidence,
        )

    async def _candidates(self, tenant: str, agent: AgentView) -> list[Candidate]:
        """The agent's production adapters with their profiles (cached for `profile_ttl_s`
        per production set, so a promotion is routed to as soon as the agent shows it)."""
        key = (tenant, agent.id, agent.production_adapters)
        cached = self._profiles.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.cfg.profile_ttl_s:
            return cached[1]
        ids = [uuid.UUID(a) for a in agent.production_adapters]
        assert self.service is not None and self.service.store is not None
        async with self.service.store.tenant(tenant) as session:
            candidates = await profiles(session, ids, self.cfg.profile_examples)
        self._profiles[key] = (now, candidates)
        return candidates

    # -- forwarding and recording ------------------------------------------------------------

    async def _relay(
        self,
        turn: Turn,
        body: dict[str, msgspec.Raw],
        history: History,
        headers: dict[str, str],
    ) -> web.Response:
        started = time.perf_counter()
        try:
            status, payload = await self.relay.post("/chat/completions", msgspec.json.encode(body))
        except (UpstreamError, TimeoutError) as exc:
            return self._unreachable(headers, exc)
        if status != 200:
            self._count(headers, f"upstream_{status}")
            return _upstream_refusal(status, payload, headers)
        try:
            parsed = msgspec.json.decode(payload)
            reply = _assistant(parsed["choices"][0]["message"])
            usage = parsed.get("usage")
        except (*UNDECODABLE, KeyError, IndexError, TypeError, AttributeError):
            self._count(headers, "upstream_malformed")
            return error(502, "the inference endpoint returned a malformed reply", "upstream_error")
        headers = self._answered(
            turn,
            headers,
            history,
            reply,
            _completion_tokens(usage),
            (time.perf_counter() - started) * 1000,
        )
        self._count(headers, "ok")
        return web.Response(
            body=payload, status=200, content_type="application/json", headers=headers
        )

    async def _relay_stream(
        self,
        request: web.Request,
        turn: Turn,
        body: dict[str, msgspec.Raw],
        history: History,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        started = time.perf_counter()
        streamed = _Streamed()
        try:
            async with self.relay.stream(
                "/chat/completions", msgspec.json.encode(body)
            ) as upstream:
                if upstream.status != 200:
                    self._count(headers, f"upstream_{upstream.status}")
                    return _upstream_refusal(upstream.status, await upstream.read(), headers)
                out = web.StreamResponse(
                    headers={
                        "Content-Type": "text/event-stream",
                        "Cache-Control": "no-cache",
                        **headers,
                    }
                )
                partial = b""  # a line the last chunk ended inside
                try:
                    await out.prepare(request)
                    async for chunk in upstream.chunks():
                        await write_within(request, out, chunk, CALLER_WRITE_S)
                        *lines, partial = (partial + chunk).split(b"\n")
                        for line in lines:
                            streamed.fold(line)
                    streamed.fold(partial)
                except (ConnectionResetError, CallerStalled):
                    # the caller left (or stopped reading): the endpoint's stream is closed
                    # (it stops generating), and a turn whose reply nobody saw whole is not
                    # recorded
                    self._count(headers, "caller_left")
                    log.debug("caller left a stream", target=headers[ADAPTER_HEADER])
                    return out
                except (UpstreamError, TimeoutError) as exc:
                    # the endpoint broke off (or timed out) mid-reply: the status went out
                    # with the first chunk, so the stream ends with an error event, OpenAI's
                    # way; a turn without its whole reply is not recorded
                    self._count(headers, "upstream_error")
                    log.warning("inference endpoint broke off a stream", error=repr(exc))
                    failed = ErrorResponse(
                        error=ErrorBody(
                            message="the inference endpoint broke off the reply; try again",
                            type="upstream_error",
                            code=502,
                        )
                    )
                    with contextlib.suppress(ConnectionResetError, CallerStalled):
                        event = b"data: " + msgspec.json.encode(failed) + b"\n\n"
                        await write_within(request, out, event, CALLER_WRITE_S)
                        await end_within(request, out, CALLER_WRITE_S)
                    return out
        except (UpstreamError, TimeoutError) as exc:  # before the reply began
            return self._unreachable(headers, exc)
        if not streamed.whole:
            # the endpoint said the reply broke off (an error event, or no [DONE]): the
            # caller saw it fail, so the turn is not kept (it was, as a whole reply)
            self._count(headers, "upstream_error")
            log.warning("inference endpoint ended a stream without a whole reply")
            with contextlib.suppress(ConnectionResetError, CallerStalled):
                await end_within(request, out, CALLER_WRITE_S)
            return out
        self._answered(
            turn,
            headers,
            history,
            _assistant(streamed.reply()),
            streamed.tokens,
            (time.perf_counter() - started) * 1000,
        )  # its headers went with the first chunk: a branch shows on the next reply
        self._count(headers, "ok")
        # left (or stalled) with the reply whole: kept
        with contextlib.suppress(ConnectionResetError, CallerStalled):
            await end_within(request, out, CALLER_WRITE_S)
        return out

    def _unreachable(self, headers: dict[str, str], exc: BaseException) -> web.Response:
        """A 502 for an endpoint that could not be reached (its address stays in the log); a
        503 where every connection to it stayed in use."""
        if isinstance(exc, UpstreamBusyError):
            self._count(headers, "upstream_busy")
            return error(
                503, "the inference endpoint is busy; try again", headers=_on_error(headers)
            )
        self._count(headers, "upstream_error")
        log.warning(
            "inference endpoint unreachable", target=headers[ADAPTER_HEADER], error=repr(exc)
        )
        return error(
            502,
            "the inference endpoint is unreachable; try again",
            "upstream_error",
            _on_error(headers),
        )

    def _count(self, headers: dict[str, str], outcome: str) -> None:
        if self.routed is not None:
            self.routed.labels(headers[ADAPTER_HEADER], outcome).inc()

    def _answered(
        self,
        turn: Turn,
        headers: dict[str, str],
        history: History,
        reply: dict[str, Any],
        tokens: int,
        latency_ms: float,
    ) -> dict[str, str]:
        """The turn's conversation moves on (or, when another turn of it was answered since
        this one found it, the turn becomes a branch of its own: a new conversation with
        the same route, so neither overwrites the other); its record is queued. The reply's
        headers, naming the conversation it belongs to."""
        model = headers[ADAPTER_HEADER]  # the target the turn was sent to
        messages = [*history.messages, reply]
        new_tip = history.tip_with(reply)
        if self.recent.answered(turn.known, turn.found_tip, new_tip) is None:
            was = turn.known
            route = {**was.route, "branch_of": str(was.id)}
            turn.known = self.recent.remember(
                Known(
                    uuid.uuid4(),
                    was.agent_id,
                    was.api_key_id,
                    was.adapter_id,
                    route,
                    new_tip,
                    turn.found_turns + 1,
                )
            )
            turn.opening = Opening(
                was.agent_id, was.adapter_id, was.api_key_id, route, turn.found_turns
            )
            turn.found_tip = ""
            headers = {**headers, CONVERSATION_HEADER: str(turn.known.id)}
        assert self.recorder is not None
        self.recorder.submit(Answered(turn, model, messages, new_tip, tokens, latency_ms))
        return headers

    async def start(self, service: Service) -> None:
        assert service.store is not None
        self.recorder = Recorder(service.store, limit=self.cfg.unrecorded_limit, spool=self.spool)
        self.recorder.start()
        if self.cfg.key_index_s > 0:
            self.key_index = KeyIndex(service.store, self.cfg.key_index_s)
            self.key_index.start()
        # any tenant may be given a rate at any time (its quotas): always shared
        self.exchange = SpendingExchange(
            asyncpg_dsn(service.store.engine.url), self.cfg.database.schema, self.limits
        )
        self.exchange.start()
        self.token_exchange = SpendingExchange(
            asyncpg_dsn(service.store.engine.url),
            f"{self.cfg.database.schema}#tokens",  # its own stream on the channel
            self.token_limits,
        )
        self.token_exchange.start()
        if isinstance(self.mode, EmbeddingRouting):
            # loaded before the first request (the static table built on a first run, 10 s)
            await asyncio.to_thread(self.mode.warm)
        if self.cfg.cache_s > 0:
            self._feed = ChangeFeed(
                asyncpg_dsn(service.store.engine.url), self.cfg.database.schema, self._changed
            )
            self.keys = RowCache(self._feed, self.cfg.cache_s)
            self.agents = RowCache(self._feed, self.cfg.cache_s)
            self.adapters = RowCache(self._feed, self.cfg.cache_s)
            self._feed.start()

    def _generation(self) -> int:
        """The change feed's generation, noted before a store read whose rows may be kept."""
        return self._feed.generation if self._feed is not None else 0

    def _changed(self, table: str | None, row: str | None) -> None:
        for cache in (self.keys, self.agents, self.adapters):
            if cache is not None:
                cache.changed(table, row)

    async def feedback(self, request: web.Request) -> web.Response:
        authorized = await self._authorized(request)
        if isinstance(authorized, web.Response):
            return authorized
        tenant, raw = authorized
        try:
            fb = msgspec.json.decode(raw, type=Feedback)
        except UNDECODABLE as exc:
            return error(400, f"invalid feedback: {exc}")
        if fb.reward is None and fb.success is None:
            return error(400, "feedback needs `reward` (0..1) or `success` (bool)")
        if fb.reward is not None and not 0.0 <= fb.reward <= 1.0:
            return error(400, f"reward must be in [0, 1], got {fb.reward}")
        assert self.service is not None and self.service.store is not None
        if self.recorder is not None:  # the turns answered so far are in the store first
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FEEDBACK_WAIT_S):
                    await self.recorder.flush()
        async with self.service.store.tenant(tenant) as session:
            conversation = await session.get(Conversation, fb.conversation_id)
            if conversation is None or conversation.trajectory_id is None:
                return error(404, f"no conversation {fb.conversation_id} for this tenant")
            trajectory = await session.get(Trajectory, conversation.trajectory_id)
            if trajectory is None:
                return error(404, f"conversation {fb.conversation_id} has no trajectory")
            success = fb.success if fb.success is not None else (fb.reward or 0.0) >= 1.0
            trajectory.success = success
            trajectory.reward = fb.reward if fb.reward is not None else float(success)
        return web.json_response({"conversation_id": str(fb.conversation_id), "recorded": True})


def _on_error(headers: dict[str, str]) -> dict[str, str]:
    """The headers of a request's error reply: the target it was for, no conversation (the
    turn was not answered, so none was opened or moved on)."""
    return {k: v for k, v in headers.items() if k == ADAPTER_HEADER}


def _upstream_refusal(status: int, payload: bytes, headers: dict[str, str]) -> web.Response:
    """The endpoint's answer other than 200, in the OpenAI error shape whatever it sent: a
    4xx of the request's own (too long, a bad parameter) passed on with its message; the
    endpoint refusing the router's own key (401, 403) or failing (5xx) a 502 whose details
    stay in the log; the endpoint too busy (429) a 503 with Retry-After."""
    try:
        found = msgspec.json.decode(payload)["error"]
        message = str(found["message"] if isinstance(found, dict) else found)
        kind = found.get("type") if isinstance(found, dict) else None
    except (*UNDECODABLE, KeyError, TypeError, IndexError):
        message = payload.decode(errors="replace").strip()
        kind = None
    if status == 429:
        return error(503, "the inference endpoint is busy; try again", headers=_on_error(headers))
    if status == 404:  # the target is the router's choice; the endpoint's own text may name
        # what else it serves (other tenants' adapters), so it stays in the log
        log.debug("inference endpoint 404 text", text=message[:2000])
        return error(
            404,
            f"the inference endpoint does not serve {headers[ADAPTER_HEADER]!r} now; try again",
            "not_found_error",
            _on_error(headers),
        )
    if status >= 500 or status < 400 or status in (401, 403):
        # its text may echo the request (vLLM's do): user content, so at debug only
        log.warning("inference endpoint failed", status=status, error_type=kind)
        log.debug("inference endpoint failure text", status=status, text=message[:2000])
        return error(
            502,
            f"the inference endpoint failed (HTTP {status})",
            "upstream_error",
            _on_error(headers),
        )
    return error(
        status,
        message[:2000] or f"the inference endpoint refused the request (HTTP {status})",
        kind if isinstance(kind, str) else None,
        _on_error(headers),
    )


def _completion_tokens(usage: Any) -> int:
    """A reply's (or a stream's usage chunk's) completion tokens; 0 where its `usage` is
    missing or of another shape (an upstream's odd answer is still the caller's reply)."""
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(counted, int | float) and not isinstance(counted, bool):
        return int(counted)
    return 0


CALLER_WRITE_S = WRITE_TIMEOUT_S
"""How long a stream's write may wait for its caller to read: a caller who stopped reading
held its connection to the model server (and its tenant's place) for ever."""


def _assistant(reply: Any) -> dict[str, Any]:
    """The turn a whole reply's message makes; a TypeError where it is not an OpenAI
    assistant message (text or null, tool calls each naming a function), which the turn's
    hash could not take: before, it raised on that after the reply was made, a 500."""
    if not isinstance(reply, dict):
        raise TypeError(f"a message is an object, not {type(reply).__name__}")
    content = reply.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("a message's content is text or null")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    calls = reply.get("tool_calls")
    if calls:
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            raise TypeError("a message's tool_calls are objects, each with a function")
        out["tool_calls"] = calls
    return out


class _Streamed:
    """The reply a stream carries, folded line by line: its first choice's text and tool
    calls (a stream of `n` choices interleaves them, each chunk naming its own `index`; the
    turn recorded is the first, as for a whole reply), and the completion tokens of the
    usage chunk where the caller asked for one (`stream_options.include_usage`), else 0."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.tokens = 0
        self.done = False
        """`[DONE]` came: the endpoint ended the reply as a whole one."""
        self.failed = False
        """An error event came (OpenAI's, vLLM's and serve-model's way to end a stream
        that broke after its 200)."""

    @property
    def whole(self) -> bool:
        """Whether the stream carried a whole reply (only such a turn is recorded)."""
        return self.done and not self.failed

    def fold(self, line: bytes) -> None:
        """Fold one SSE line in."""
        text = line.strip()
        if not text.startswith(b"data:"):
            return
        data = text[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = msgspec.json.decode(data)
        except UNDECODABLE:
            return
        if not isinstance(chunk, dict):
            return
        if chunk.get("error") is not None:
            self.failed = True
            return
        if "usage" in chunk:
            self.tokens = _completion_tokens(chunk["usage"]) or self.tokens
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._delta(choice.get("delta"))

    def _delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
                continue
            entry = self.calls.setdefault(
                call.get("index", 0),
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {"name": "", "arguments": ""},
                },
            )
            function = call.get("function")
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        entry["function"][key] += function[key]
            entry["id"] = entry["id"] or call.get("id")

    def reply(self) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": "".join(self.content) or None,
            "tool_calls": [self.calls[i] for i in sorted(self.calls)] or None,
        }


def _conversation_named(request: web.Request) -> uuid.UUID | web.Response | None:
    """The conversation the request names in its header (None without one); a 400 for an
    id that is not one."""
    given = request.headers.get(CONVERSATION_HEADER, "").strip()
    if not given:
        return None
    try:
        return uuid.UUID(given)
    except ValueError:
        return error(
            400,
            f"{CONVERSATION_HEADER} must be a conversation id (a UUID a reply gave you), "
            f"not {given[:80]!r}",
        )


def _known(row: Conversation) -> Known:
    return Known(
        row.id, row.agent_id, row.api_key_id, row.adapter_id, dict(row.route), row.tip, row.turns
    )
