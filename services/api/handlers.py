"""The control API's routes: what a tenant does with retrace, over HTTP with its API key.

Every `/v1` route needs a tenant's key (`Authorization: Bearer ...`) and sees only that
tenant's rows: sessions are opened for the key's tenant, so another tenant's object is
"not found" (404), never "forbidden", and its existence is never told. `/v1/admin` routes
need the operator's key instead (`RETRACE_API_ADMIN_KEY`; without one they answer 404).
Errors are JSON in the shape the router uses (`{"error": {"message", "type", "code"}}`);
lists are paged (`limit`, `cursor`; see paging.py). Long work never runs here: a cycle is
requested over the bus (the evaluator runs it), and followed by reading the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from services.api import paging
from services.api.config import ApiConfig
from services.api.console import Console
from services.api.schema import (
    AdapterList,
    AdapterOut,
    AgentCreate,
    AgentList,
    AgentOut,
    AgentUpdate,
    CapabilityList,
    CapabilityOut,
    CycleList,
    CycleOut,
    CycleStart,
    Deleted,
    EnvironmentList,
    EnvironmentOut,
    EvaluationList,
    EvaluationOut,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyOut,
    QuotaStatus,
    TenantCreate,
    TenantList,
    TenantOut,
    TrajectoryList,
    TrajectoryOut,
    WorkOut,
)
from shared.cycle import ENDED, REQUEST, State, allowed
from shared.envs.registry import available, canonical, get_environment, open_environment
from shared.envs.remote.address import tenant_url_refusal
from shared.errors import UNDECODABLE, PermanentError, RetryableError
from shared.llm.errors_http import carries_key, json_errors, openai_error, presented_token
from shared.logging import get_logger
from shared.messages import CycleCompleted, CycleRequested, CycleSettings
from shared.runtime.deadlines import body_deadline
from shared.runtime.http import ACTING_FOR
from shared.runtime.service import Service
from shared.store import quotas
from shared.store.agents import (
    AgentBusyError,
    AgentExistsError,
    AgentNotFoundError,
    create_agent,
    delete_agent,
    get_agent,
    validate_agent_name,
)
from shared.store.engine import STORE_ERRORS, not_the_store
from shared.store.models import (
    Adapter,
    Agent,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    KeyScope,
    Tenant,
    Trajectory,
    Work,
)
from shared.store.tenants import (
    TenantExistsError,
    UnknownKeyError,
    create_tenant,
    issue_api_key,
    list_api_keys,
    live_key,
    revoke_api_key,
    scope_refusal,
    well_formed,
)
from shared.store.work import NotCancellableError, cancel
from shared.subjects import TENANT_RE

log = get_logger(__name__)

T = TypeVar("T")
TENANT = web.RequestKey("tenant", str)
OPERATOR = web.RequestKey("operator", bool)
"""Whether the request came with the admin key (acting for a tenant)."""
Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, message: str, kind: str | None = None) -> web.Response:
    headers = {"Retry-After": "2"} if status == 503 else None
    return openai_error(status, message, kind, headers=headers)


def ok(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body), status=status, content_type="application/json"
    )


class Refused(Exception):
    """A request the API answers with an error (`status`, `message`; `retry_after_s` for a
    Retry-After header)."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


def over_quota(exc: quotas.QuotaExceededError) -> Refused:
    """A quota reached: 429, with when to try again where waiting frees one."""
    return Refused(429, str(exc), exc.retry_after_s)


async def body(request: web.Request, kind: type[T]) -> T:
    """The request's JSON body as `kind`, or a 400 naming what was wrong."""
    raw = await request.read()
    try:
        return msgspec.json.decode(raw, type=kind)
    except UNDECODABLE as exc:
        raise Refused(400, f"invalid request body: {str(exc)[:500]}") from None


async def key_spec(request: web.Request, default_name: str) -> tuple[str, KeyScope]:
    """The name and scope of the key a request asks for (`KeyCreate`; an empty body: scope
    `all`), named `default_name` where it gives no name."""
    spec = await body(request, KeyCreate) if await request.read() else KeyCreate()
    return spec.name or default_name, spec.scope


def uuid_of(raw: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Refused(404, f"no {what} {raw[:80]!r}") from None


def query_uuid(request: web.Request, name: str) -> uuid.UUID | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Refused(400, f"{name} must be an id, not {raw[:80]!r}") from None


@web.middleware
async def refusals(request: web.Request, handler: Route) -> web.StreamResponse:
    """`Refused` and the store's own refusals as JSON errors; a store out of reach is a 503."""
    try:
        return await handler(request)
    except Refused as exc:
        if exc.status == 429:
            retry = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
            return openai_error(429, exc.message, "quota_exceeded", headers=retry)
        return error(exc.status, exc.message)
    except paging.BadPageError as exc:
        return error(400, str(exc))
    except IntegrityError:  # a race another request won (two agents of one name at once)
        return error(409, "conflicts with a change made at the same time; read it and retry")
    except STORE_ERRORS as exc:
        if not_the_store(exc):
            raise
        log.warning("store unavailable", path=request.path, error=repr(exc))
        return error(503, "the store is unavailable, try again", "service_unavailable")


class ApiApp:
    def __init__(self, cfg: ApiConfig) -> None:
        self.cfg = cfg
        if cfg.tenant_environments_private and not cfg.environments.private_allowed:
            log.warning(
                "RETRACE_API_TENANT_ENVIRONMENTS_PRIVATE=true has no effect: "
                "RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false, no private address is named"
            )
        self.service: Service | None = None
        self._environments: tuple[float, list[EnvironmentOut]] | None = None

    def attach(self, service: Service) -> None:
        self.service = service

    def routes(self, app: web.Application) -> None:
        app.middlewares.extend(
            [json_errors, body_deadline(self.cfg.http.body_timeout_s), refusals, self.authenticate]
        )
        r = app.router
        r.add_get("/v1/agents", self.list_agents)
        r.add_post("/v1/agents", self.create_agent)
        r.add_get("/v1/agents/{name}", self.get_agent)
        r.add_patch("/v1/agents/{name}", self.update_agent)
        r.add_delete("/v1/agents/{name}", self.delete_agent)
        r.add_post("/v1/agents/{name}/cycles", self.start_cycle)
        r.add_get("/v1/environments", self.list_environments)
        r.add_get("/v1/cycles", self.list_cycles)
        r.add_get("/v1/cycles/{id}", self.get_cycle)
        r.add_post("/v1/cycles/{id}/cancel", self.cancel_cycle)
        r.add_get("/v1/cycles/{id}/events", self.cycle_events)
        r.add_get("/v1/capabilities", self.list_capabilities)
        r.add_get("/v1/evaluations", self.list_evaluations)
        r.add_get("/v1/adapters", self.list_adapters)
        r.add_post("/v1/adapters/{id}/promote", self.promote)
        r.add_post("/v1/adapters/{id}/demote", self.demote)
        r.add_get("/v1/trajectories", self.list_trajectories)
        r.add_get("/v1/trajectories/{id}", self.get_trajectory)
        r.add_get("/v1/quotas", self.get_quotas)
        r.add_get("/v1/keys", self.list_keys)
        r.add_post("/v1/keys", self.create_key)
        r.add_delete("/v1/keys/{key}", self.revoke_key)
        r.add_get("/v1/admin/tenants", self.list_tenants)
        r.add_post("/v1/admin/tenants", self.create_tenant)
        r.add_post("/v1/admin/tenants/{tenant}/keys", self.create_tenant_key)
        r.add_put("/v1/admin/tenants/{tenant}/quotas", self.set_quotas)
        Console(self._store, self.cycle_events).routes(app)
        from services.api.openapi import api_openapi  # built from this module's routes
        from shared.openapi import serve

        serve(app, api_openapi())

    # -- who is asking ------------------------------------------------------------------------

    @web.middleware
    async def authenticate(self, request: web.Request, handler: Route) -> web.StreamResponse:
        if request.path.startswith("/v1/admin/") or request.path == "/v1/admin":
            admin = self.cfg.admin_key
            if admin is None or not carries_key(request, admin):
                # without a configured key the operator routes do not exist
                return error(404 if admin is None else 401, "operator routes need the admin key")
            return await handler(request)
        if request.path.startswith("/v1/"):
            presented = presented_token(request)
            if not presented:
                return error(401, "missing bearer token (a tenant API key)")
            admin = self.cfg.admin_key
            async with self._store().cross_tenant() as session:
                given = presented.encode("utf-8", "surrogateescape")  # a header not UTF-8
                if admin is not None and hmac.compare_digest(given, admin.encode()):
                    # the operator (the CLI) acts for the tenant it names
                    tenant = request.headers.get(ACTING_FOR, "")
                    if not tenant:
                        return error(
                            401, f"the admin key acts for a tenant: name it in {ACTING_FOR}"
                        )
                    request[OPERATOR] = True
                    if not TENANT_RE.fullmatch(tenant):
                        return error(
                            400,
                            f"{ACTING_FOR} must be a tenant id (1-63 lowercase letters, digits "
                            f"and inner dashes), not {tenant[:80]!r}",
                        )
                    if await session.get(Tenant, tenant) is None:
                        return error(
                            404,
                            f"no tenant {tenant[:80]!r}: create it first (`retrace tenant create "
                            f"{tenant[:80]}` or POST /v1/admin/tenants)",
                        )
                else:
                    found = await live_key(session, presented) if well_formed(presented) else None
                    if found is None:
                        return error(401, "unknown or revoked API key")
                    why = scope_refusal(found.scope, "control", request.method)
                    if why is not None:
                        return error(403, why)
                    tenant = found.tenant_id
            request[TENANT] = tenant
        return await handler(request)

    def _store(self) -> Any:
        assert self.service is not None and self.service.store is not None
        return self.service.store

    def _session(self, request: web.Request) -> Any:
        return self._store().tenant(request[TENANT])

    # -- agents -------------------------------------------------------------------------------

    async def list_agents(self, request: web.Request) -> web.Response:
        limit = paging.limit_of(request.query.get("limit"))
        query = paging.paged(select(Agent), Agent, request.query.get("cursor"), limit)
        async with self._session(request) as session:
            rows, cursor = paging.page(list(await session.scalars(query)), limit)
        return ok(AgentList(data=[AgentOut.of(a) for a in rows], next_cursor=cursor))

    async def create_agent(self, request: web.Request) -> web.Response:
        spec = await body(request, AgentCreate)
        try:
            validate_agent_name(spec.name)
        except PermanentError as exc:
            raise Refused(400, str(exc)) from None
        environment = await self._known_environment(spec.environment, request)
        async with self._session(request) as session:
            try:
                agent = await create_agent(
                    session,
                    spec.name,
                    model=spec.model,
                    environment=environment,
                    system_prompt=spec.system_prompt,
                )
            except AgentExistsError as exc:
                raise Refused(409, str(exc)) from None
            except quotas.QuotaExceededError as exc:
                raise over_quota(exc) from None
            out = AgentOut.of(agent)
        return ok(out, 201)

    async def get_agent(self, request: web.Request) -> web.Response:
        async with self._session(request) as session:
            return ok(AgentOut.of(await self._agent(session, request.match_info["name"])))

    async def update_agent(self, request: web.Request) -> web.Response:
        change = await body(request, AgentUpdate)
        if change.environment is not None:
            change = msgspec.structs.replace(
                change, environment=await self._known_environment(change.environment, request)
            )
        async with self._session(request) as session:
            agent = await self._agent(session, request.match_info["name"])
            for field in ("model", "environment", "system_prompt"):
                value = getattr(change, field)
                if value is not None:
                    setattr(agent, field, value)
            await session.flush()
            await session.refresh(agent)
            out = AgentOut.of(agent)
        return ok(out)

    async def delete_agent(self, request: web.Request) -> web.Response:
        async with self._session(request) as session:
            try:
                agent = await delete_agent(session, request.match_info["name"])
            except AgentBusyError as exc:
                raise Refused(409, str(exc)) from None
            except AgentNotFoundError as exc:
                raise Refused(404, str(exc)) from None
        return ok(Deleted(id=agent.id))

    @staticmethod
    async def _agent(session: Any, name: str) -> Any:
        try:
            return await get_agent(session, name)
        except AgentNotFoundError as exc:
            raise Refused(404, str(exc)) from None

    async def _known_environment(self, ref: str, request: web.Request) -> str:
        """The reference as stored. A registered one (built in, installed) is opened now, so
        one that cannot run is refused rather than failing the first cycle. An HTTP one is
        the tenant's own server: stored as given and first reached by the evaluator (this
        service fetches no URL a tenant names, and shows no answer of one). An `mcp:` file is
        a path on the server: the operator's to name (the admin key), never a tenant's. A
        tenant's URL is a base URL on a public address unless the operator allows private
        ones (`tenant_environments_private`): the services call it from inside the network."""
        if ref.startswith(("http://", "https://")):
            # where no service may reach a private address, nobody may name one
            private = self.cfg.environments.private_allowed and (
                self.cfg.tenant_environments_private or request.get(OPERATOR, False)
            )
            why = await tenant_url_refusal(ref, private)
            if why is not None:
                hint = ""
                # (an inner address under a public name says so itself: DNS rebinding)
                if "private network" in why:
                    hint = (
                        " (the operator allows such addresses with "
                        "RETRACE_API_TENANT_ENVIRONMENTS_PRIVATE=true)"
                        if self.cfg.environments.private_allowed
                        else " (this deployment reaches no environment there: "
                        "RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false)"
                    )
                raise Refused(400, why + hint)
            return ref
        if ref.startswith("mcp:"):
            if not request.get(OPERATOR, False):
                raise Refused(
                    403,
                    "an mcp: environment names a file on the server: only the operator "
                    "registers one (`retrace agent create` on the server, or the admin key)",
                )
        elif ref not in available():
            raise Refused(400, f"unknown environment {ref!r} (GET /v1/environments lists them)")
        try:
            await open_environment(canonical(ref))
        except (PermanentError, RetryableError) as exc:
            raise Refused(400, f"environment {ref!r} cannot be opened: {exc}") from None
        return canonical(ref)

    # -- environments -------------------------------------------------------------------------

    async def list_environments(self, request: web.Request) -> web.Response:
        """The environments an agent can name (on the first page; cached a minute: loading
        some takes seconds), then the tenant's synthesized ones, newest first and paged."""
        cursor = request.query.get("cursor")
        registered: list[EnvironmentOut] = []
        if cursor is None:
            now = time.monotonic()
            if self._environments is None or now - self._environments[0] > 60:
                self._environments = (now, await asyncio.to_thread(_registered))
            registered = self._environments[1]
        rows, after = await self._page(request, Environment, Environment.kind == "synthetic")
        data = [*registered, *(EnvironmentOut.synthesized(e) for e in rows)]
        return ok(EnvironmentList(data=data, next_cursor=after))

    # -- cycles -------------------------------------------------------------------------------

    async def start_cycle(self, request: web.Request) -> web.Response:
        """Request a cycle for the agent (202: the evaluator runs it). The cycle is recorded
        as `requested` first, so it can be followed at once, then its request published; a
        repeat with the same `cycle_id` publishes it again while it is still requested (the
        bus drops the copy), and requests nothing new after; an agent with a cycle under way
        gets a 409, a tenant at its quota a 429."""
        start = await body(request, CycleStart)
        cycle_id = start.cycle_id or uuid.uuid4()
        try:
            cycle, asked = await self._recorded(request, cycle_id, start)
        except (IntegrityError, Refused) as exc:
            # the same cycle_id sent twice at once (a client retrying): the first made the
            # row, which the second's insert or quota check then ran into; it is a repeat
            repeat = await self._repeat(request, cycle_id)
            if repeat is None:
                raise exc from None
            cycle, asked = repeat
        if cycle.state != State.REQUESTED:
            return ok(cycle, 202)
        return await self._publish(request, cycle, asked)

    async def _recorded(
        self, request: web.Request, cycle_id: uuid.UUID, start: CycleStart
    ) -> tuple[CycleOut, CycleStart]:
        """The cycle `cycle_id` of the agent, recorded as requested now unless it exists,
        with the settings it was first asked with."""
        async with self._session(request) as session:
            agent = await self._agent(session, request.match_info["name"])
            existing = await session.get(Cycle, cycle_id)
            if existing is not None:
                if existing.agent_id != agent.id:
                    raise Refused(409, f"cycle {cycle_id} is another agent's")
                return CycleOut.of(existing), _asked(existing)
            active = await session.scalar(
                select(Cycle.id).where(Cycle.agent_id == agent.id, Cycle.state.not_in(ENDED))
            )
            if active is not None:
                raise Refused(409, f"agent has a cycle under way: {active} (cancel it first)")
            try:  # the evaluator checks again when it takes the request (this answers now)
                await quotas.check_cycle(session, request[TENANT])
            except quotas.QuotaExceededError as exc:
                raise over_quota(exc) from None
            if not allowed(None, State.REQUESTED, REQUEST):
                raise AssertionError("the cycle table has no requested state")
            row = Cycle(
                id=cycle_id,
                agent_id=agent.id,
                state=State.REQUESTED,
                trigger="manual",
                # the settings, as the evaluator's cycle data keeps them once it takes it
                data={"settings": msgspec.to_builtins(start.settings)},
            )
            session.add(row)
            await session.flush()
            await session.refresh(row)
            return CycleOut.of(row), start

    async def _repeat(
        self, request: web.Request, cycle_id: uuid.UUID
    ) -> tuple[CycleOut, CycleStart] | None:
        """The cycle `cycle_id` when it exists for the agent the request names, else None."""
        async with self._session(request) as session:
            agent = await self._agent(session, request.match_info["name"])
            existing = await session.get(Cycle, cycle_id)
            if existing is None or existing.agent_id != agent.id:
                return None
            return CycleOut.of(existing), _asked(existing)

    async def _publish(
        self, request: web.Request, cycle: CycleOut, asked: CycleStart
    ) -> web.Response:
        """Publish a recorded cycle's request (its transaction committed, none open now).
        When the bus cannot confirm it, the row stays requested (the request may have
        landed) and the answer is a 503 saying to repeat with the same `cycle_id`; a row never
        taken is failed by the stall watch within the hour."""
        assert self.service is not None and self.service.bus is not None
        message = CycleRequested(
            cycle_id=cycle.id, agent_id=cycle.agent_id, settings=asked.settings
        )
        try:
            await self.service.bus.publish(request[TENANT], message, msg_id=f"api-cycle/{cycle.id}")
        except RetryableError as exc:
            log.warning("cycle request not confirmed", cycle=str(cycle.id), error=str(exc))
            raise Refused(
                503,
                f"cycle {cycle.id} is recorded, but the bus did not confirm its request: "
                "repeat this request with the same cycle_id",
            ) from None
        return ok(cycle, 202)

    async def list_cycles(self, request: web.Request) -> web.Response:
        rows, cursor = await self._page(request, Cycle)
        return ok(CycleList(data=[CycleOut.of(c) for c in rows], next_cursor=cursor))

    async def _page(
        self, request: web.Request, model: Any, *where: Any
    ) -> tuple[list[Any], str | None]:
        """A page of the tenant's `model` rows matching `where`, of the agent the `agent`
        parameter names when there is one, and the next page's cursor."""
        async with self._session(request) as session:
            return await self._page_in(session, request, model, *where)

    async def _page_in(
        self, session: Any, request: web.Request, model: Any, *where: Any
    ) -> tuple[list[Any], str | None]:
        """`_page` in a session the caller holds."""
        limit = paging.limit_of(request.query.get("limit"))
        query = select(model).where(*where)
        if "agent" in request.query and hasattr(model, "agent_id"):
            agent = await self._agent(session, request.query["agent"])
            query = query.where(model.agent_id == agent.id)
        query = paging.paged(query, model, request.query.get("cursor"), limit)
        return paging.page(list(await session.scalars(query)), limit)

    async def get_cycle(self, request: web.Request) -> web.Response:
        return ok(await self._cycle(request[TENANT], uuid_of(request.match_info["id"], "cycle")))

    async def _cycle(self, tenant: str, cycle_id: uuid.UUID) -> CycleOut:
        async with self._store().tenant(tenant) as session:
            cycle = await session.get(Cycle, cycle_id)
            if cycle is None:
                raise Refused(404, f"no cycle {cycle_id}")
            work = await session.scalars(
                select(Work)
                .where(Work.cycle_id == cycle_id, Work.state == "running")
                .order_by(Work.started_at)
            )
            views = [
                WorkOut(
                    id=w.id, kind=w.kind, label=w.label, done=w.done, total=w.total, unit=w.unit
                )
                for w in work
            ]
            return CycleOut.of(cycle, views)

    async def cancel_cycle(self, request: web.Request) -> web.Response:
        cycle_id = uuid_of(request.match_info["id"], "cycle")
        async with self._session(request) as session:
            # a scalar, not the row: cancel() reads the row itself, locked
            if await session.scalar(select(Cycle.id).where(Cycle.id == cycle_id)) is None:
                raise Refused(404, f"no cycle {cycle_id}")
            try:
                _, _, ended = await cancel(session, cycle_id, by="the control API")
            except NotCancellableError as exc:
                raise Refused(409, str(exc)) from None
        if ended is not None and self.service is not None and self.service.bus is not None:
            await self.service.bus.publish(
                request[TENANT],
                CycleCompleted(cycle_id=ended.id, outcome="failed", reason=ended.reason),
                msg_id=f"cancelled/{ended.id}",
            )
        return ok(await self._cycle(request[TENANT], cycle_id))

    async def cycle_events(self, request: web.Request) -> web.StreamResponse:
        """The cycle as Server-Sent Events: an `event: cycle` with the whole cycle each time it
        changes (stage, work progress), until it ends; a comment every 15 s keeps proxies
        from closing a quiet stream. Each look at the store is its own short transaction."""
        tenant = request[TENANT]
        cycle_id = uuid_of(request.match_info["id"], "cycle")
        last = await self._cycle(tenant, cycle_id)  # a 404 before the stream starts
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await out.prepare(request)
        sent: bytes | None = None
        quiet_since = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            while True:
                data = msgspec.json.encode(last)
                if data != sent:
                    await out.write(b"event: cycle\ndata: " + data + b"\n\n")
                    sent, quiet_since = data, time.monotonic()
                    if last.state in ENDED:
                        break
                elif time.monotonic() - quiet_since > 15:
                    await out.write(b": still running\n\n")
                    quiet_since = time.monotonic()
                await asyncio.sleep(self.cfg.events_poll_s)
                try:
                    last = await self._cycle(tenant, cycle_id)
                except STORE_ERRORS as exc:  # the stream outlives a store's restart
                    log.warning("cycle events: store unavailable", error=repr(exc))
                except Refused:  # deleted with its agent
                    break
            await out.write_eof()
        return out

    # -- what cycles produced -----------------------------------------------------------------

    async def list_capabilities(self, request: web.Request) -> web.Response:
        cycle_id = query_uuid(request, "cycle")
        where = [Capability.cycle_id == cycle_id] if cycle_id is not None else []
        rows, cursor = await self._page(request, Capability, *where)
        return ok(CapabilityList(data=[CapabilityOut.of(c) for c in rows], next_cursor=cursor))

    async def list_evaluations(self, request: web.Request) -> web.Response:
        cycle_id = query_uuid(request, "cycle")
        where = [Evaluation.cycle_id == cycle_id] if cycle_id is not None else []
        rows, cursor = await self._page(request, Evaluation, *where)
        return ok(EvaluationList(data=[EvaluationOut.of(e) for e in rows], next_cursor=cursor))

    async def list_adapters(self, request: web.Request) -> web.Response:
        cycle_id = query_uuid(request, "cycle")
        where = [Adapter.cycle_id == cycle_id] if cycle_id is not None else []
        async with self._session(request) as session:
            rows, cursor = await self._page_in(session, request, Adapter, *where)
            owners = select(Agent).where(Agent.id.in_({a.agent_id for a in rows}))
            serving = {
                str(a)
                for agent in await session.scalars(owners)
                for a in agent.production_adapters or []
            }
        data = [AdapterOut.of(a, str(a.id) in serving) for a in rows]
        return ok(AdapterList(data=data, next_cursor=cursor))

    async def promote(self, request: web.Request) -> web.Response:
        """By hand: the adapter joins its agent's production set (the router serves it)."""
        return await self._production(request, add=True)

    async def demote(self, request: web.Request) -> web.Response:
        """By hand: the adapter leaves its agent's production set."""
        return await self._production(request, add=False)

    async def _production(self, request: web.Request, *, add: bool) -> web.Response:
        adapter_id = uuid_of(request.match_info["id"], "adapter")
        async with self._session(request) as session:
            adapter = await session.get(Adapter, adapter_id)
            if adapter is None:
                raise Refused(404, f"no adapter {adapter_id}")
            if add and adapter.status != "ready":
                raise Refused(409, f"adapter {adapter.name} is {adapter.status}, not ready")
            agent = await session.get(Agent, adapter.agent_id, with_for_update=True)
            assert agent is not None  # the foreign key cascades
            serving = [str(a) for a in agent.production_adapters or []]
            if add and str(adapter_id) not in serving:
                serving.append(str(adapter_id))
            if not add:
                serving = [a for a in serving if a != str(adapter_id)]
            agent.production_adapters = serving
            out = AdapterOut.of(adapter, add)
        log.info("production set changed by hand", adapter=str(adapter_id), serving=add)
        return ok(out)

    async def list_trajectories(self, request: web.Request) -> web.Response:
        where: list[Any] = []
        for name, column in (("cycle", Trajectory.cycle_id), ("adapter", Trajectory.adapter_id)):
            value = query_uuid(request, name)
            if value is not None:
                where.append(column == value)
        source = request.query.get("source")
        if source is not None:
            if source not in ("rollout", "production", "calibration"):
                raise Refused(400, "source must be rollout, production or calibration")
            where.append(Trajectory.source == source)
        success = request.query.get("success")
        if success is not None:
            if success not in ("true", "false"):
                raise Refused(400, "success must be true or false")
            where.append(Trajectory.success.is_(success == "true"))
        rows, cursor = await self._page(request, Trajectory, *where)
        return ok(TrajectoryList(data=[TrajectoryOut.of(t) for t in rows], next_cursor=cursor))

    async def get_trajectory(self, request: web.Request) -> web.Response:
        trajectory_id = uuid_of(request.match_info["id"], "trajectory")
        async with self._session(request) as session:
            row = await session.get(Trajectory, trajectory_id)
            if row is None:
                raise Refused(404, f"no trajectory {trajectory_id}")
            return ok(TrajectoryOut.of(row, whole=True))

    # -- keys ---------------------------------------------------------------------------------

    async def list_keys(self, request: web.Request) -> web.Response:
        async with self._session(request) as session:
            keys = await list_api_keys(session)
            return ok(KeyList(data=[KeyOut.of(k) for k in keys]))

    async def create_key(self, request: web.Request) -> web.Response:
        """A new key for the caller's tenant (rotation: create one, move to it, revoke the
        old); the key is shown this once. Only a key of scope `all` (or the operator) makes
        keys, of any scope: the others cannot reach this route."""
        name, scope = await key_spec(request, default_name="api")
        async with self._session(request) as session:
            key = await issue_api_key(session, request[TENANT], name, scope)
        return ok(KeyCreated(key=key, prefix=key[:16], scope=scope), 201)

    async def revoke_key(self, request: web.Request) -> web.Response:
        async with self._session(request) as session:
            try:
                row = await revoke_api_key(session, request.match_info["key"])
            except UnknownKeyError as exc:
                raise Refused(404, str(exc)) from None
            return ok(KeyOut.of(row))

    async def get_quotas(self, request: web.Request) -> web.Response:
        """The tenant's quotas and what counts against them now."""
        async with self._session(request) as session:
            tenant = await session.get(Tenant, request[TENANT])
            assert tenant is not None  # its key was just found live
            return ok(
                QuotaStatus(quotas=quotas.parse(tenant.quotas), usage=await quotas.usage(session))
            )

    # -- operator -----------------------------------------------------------------------------

    async def list_tenants(self, request: web.Request) -> web.Response:
        async with self._store().cross_tenant() as session:
            rows = await session.scalars(select(Tenant).order_by(Tenant.id))
            return ok(TenantList(data=[TenantOut.of(t) for t in rows]))

    async def create_tenant(self, request: web.Request) -> web.Response:
        spec = await body(request, TenantCreate)
        async with self._store().cross_tenant() as session:
            try:
                tenant = await create_tenant(session, spec.id, spec.name)
            except TenantExistsError as exc:
                raise Refused(409, str(exc)) from None
            except PermanentError as exc:  # an id tenants cannot have
                raise Refused(400, str(exc)) from None
            out = TenantOut.of(tenant)
        return ok(out, 201)

    async def create_tenant_key(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        async with self._store().cross_tenant() as session:
            if await session.get(Tenant, tenant) is None:
                raise Refused(404, f"no tenant {tenant!r}")
        name, scope = await key_spec(request, default_name="admin")
        async with self._store().tenant(tenant) as session:
            key = await issue_api_key(session, tenant, name, scope)
        return ok(KeyCreated(key=key, prefix=key[:16], scope=scope), 201)

    async def set_quotas(self, request: web.Request) -> web.Response:
        """Replace a tenant's quotas (null or absent: no limit)."""
        limits = await body(request, quotas.Quotas)
        tenant = request.match_info["tenant"]
        async with self._store().cross_tenant() as session:
            if await session.get(Tenant, tenant) is None:
                raise Refused(404, f"no tenant {tenant!r}")
            return ok(TenantOut.of(await quotas.set_quotas(session, tenant, limits)))


def _asked(row: Cycle) -> CycleStart:
    """The settings a recorded cycle was asked with (its data's, as the API stored them)."""
    return CycleStart(
        settings=msgspec.convert((row.data or {}).get("settings") or {}, CycleSettings)
    )


def _registered() -> list[EnvironmentOut]:
    """Every environment that can be named, with its task counts (or why it cannot load)."""
    out = []
    for name, origin in sorted(available().items()):
        try:
            splits = Counter(task.split for task in get_environment(name).tasks())
        except (PermanentError, RetryableError) as exc:
            out.append(EnvironmentOut(name=name, origin=origin, error=str(exc)))
            continue
        out.append(
            EnvironmentOut(
                name=name,
                origin=origin,
                tasks=sum(splits.values()),
                train=splits["train"],
                test=splits["test"],
            )
        )
    return out
