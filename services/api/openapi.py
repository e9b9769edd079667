"""The control API's OpenAPI document (`/openapi.json`, docs/openapi-api.json), from the Structs
its routes decode and encode."""

from __future__ import annotations

from typing import Any

from services.api.schema import (
    AdapterList,
    AdapterOut,
    AgentCreate,
    AgentList,
    AgentOut,
    AgentUpdate,
    CapabilityList,
    CycleList,
    CycleOut,
    CycleStart,
    Deleted,
    EnvironmentList,
    EvaluationList,
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
)
from shared.llm.openai_types import ErrorResponse
from shared.openapi import Route, document
from shared.runtime.http import Health
from shared.store.quotas import Quotas

PAGED = " Paged: `limit` (1-200, 50) and `cursor` (a page's `next_cursor`)."

ROUTES = (
    Route("get", "/v1/agents", "The tenant's agents, newest first." + PAGED, response=AgentList),
    Route("post", "/v1/agents", "Create an agent (201)", AgentCreate, AgentOut),
    Route("get", "/v1/agents/{name}", "One agent", response=AgentOut),
    Route("patch", "/v1/agents/{name}", "Change an agent's model, environment or prompt",
          AgentUpdate, AgentOut),
    Route("delete", "/v1/agents/{name}", "Delete an agent with everything recorded for it "
          "(409 while it has work in progress)", response=Deleted),
    Route("post", "/v1/agents/{name}/cycles", "Start a TRACE cycle (202; idempotent by "
          "`cycle_id`; 409 while another is under way)", CycleStart, CycleOut),
    Route("get", "/v1/environments", "Environments an agent can name, with task counts (on the "
          "first page), then the tenant's synthesized ones with their calibration." + PAGED,
          response=EnvironmentList),
    Route("get", "/v1/cycles", "The tenant's cycles, newest first (`agent` filters)." + PAGED,
          response=CycleList),
    Route("get", "/v1/cycles/{id}", "A cycle: its stage, per-stage data and running work",
          response=CycleOut),
    Route("post", "/v1/cycles/{id}/cancel", "Cancel a cycle (it fails, saying so)",
          response=CycleOut),
    Route("get", "/v1/cycles/{id}/events", "A cycle as Server-Sent Events: `event: cycle` with "
          "the cycle each time it changes, until it ends", media="text/event-stream"),
    Route("get", "/v1/capabilities", "Capabilities found, with statistics and evidence "
          "(`agent`, `cycle` filter)." + PAGED, response=CapabilityList),
    Route("get", "/v1/evaluations", "Each configuration's evaluation on a cycle's test split: "
          "summary (pass rate, 95% CI, pass^k) and per-task results (`agent`, `cycle` filter)."
          + PAGED, response=EvaluationList),
    Route("get", "/v1/adapters", "Adapters with training curves, held-out results and whether "
          "they serve (`agent`, `cycle` filter)." + PAGED, response=AdapterList),
    Route("post", "/v1/adapters/{id}/promote", "Serve a ready adapter (by hand)",
          response=AdapterOut),
    Route("post", "/v1/adapters/{id}/demote", "Stop serving an adapter (by hand)",
          response=AdapterOut),
    Route("get", "/v1/trajectories", "Trajectories without their messages (`agent`, `cycle`, "
          "`adapter`, `source`, `success` filter)." + PAGED, response=TrajectoryList),
    Route("get", "/v1/trajectories/{id}", "One trajectory with its messages and reward "
          "breakdown", response=TrajectoryOut),
    Route("get", "/v1/quotas", "The tenant's quotas (null: no limit) and its usage; a request "
          "over one is answered 429 `quota_exceeded`", response=QuotaStatus),
    Route("get", "/v1/keys", "The tenant's API keys (prefixes only), revoked ones included",
          response=KeyList),
    Route("post", "/v1/keys", "A new key for the tenant, shown once (201): `scope` `inference` "
          "for an application (the router only), `read` (the control API's reads and the "
          "console) or `all` (the default, every route). Only a key of scope `all` reaches "
          "the control API's changes (403 for the others)", KeyCreate, KeyCreated,
          body_optional=True),
    Route(
        "delete",
        "/v1/keys/{key}",
        "Revoke a key named by its id (GET /v1/keys), the whole key or its first characters",
        response=KeyOut,
    ),
    Route("get", "/v1/admin/tenants", "Every tenant (operator key)", response=TenantList),
    Route("post", "/v1/admin/tenants", "Create a tenant (operator key; 201)", TenantCreate,
          TenantOut),
    Route("post", "/v1/admin/tenants/{tenant}/keys", "A key for a tenant, of the scope asked "
          "(operator key; 201)", KeyCreate, KeyCreated, body_optional=True),
    Route("put", "/v1/admin/tenants/{tenant}/quotas", "Replace a tenant's quotas: `max_agents`, "
          "`max_active_cycles`, `max_cycles_per_day` (null or absent: no limit), "
          "`requests_per_s`, `request_burst`, `tokens_per_min` (its chat requests and "
          "tokens through the router; null or "
          "absent: the router's default); operator key", Quotas, TenantOut),
    *(
        Route(method, path, f"Console (HTML, signed in by a cookie): {what}", media=media,
              secured=False)
        for method, path, what, media in (
            ("get", "/console", "its home (the agents, or signing in)", "text/html"),
            ("get", "/console/", "its home", "text/html"),
            ("get", "/console/login", "the sign-in form (the tenant's API key)", "text/html"),
            ("post", "/console/login", "sign in (form field `key`; sets the cookie)",
             "text/html"),
            ("post", "/console/logout", "sign out", "text/html"),
            ("get", "/console/agents", "the tenant's agents", "text/html"),
            ("get", "/console/agents/{name}", "an agent, its cycles and adapters", "text/html"),
            ("get", "/console/cycles/{id}", "a cycle: live timeline, capabilities, "
             "environments, training curves, evaluation, routing", "text/html"),
            ("get", "/console/cycles/{id}/events", "the cycle's event stream",
             "text/event-stream"),
            ("get", "/console/trajectories/{id}", "a trajectory's conversation and reward",
             "text/html"),
        )
    ),
    Route("get", "/healthz", "Health of the service and its connections", response=Health,
          secured=False),
    Route("get", "/metrics", "Prometheus metrics (needs RETRACE_HTTP_METRICS_KEY when set)",
          media="text/plain"),
)  # fmt: skip


def api_openapi() -> dict[str, Any]:
    return document(
        "retrace control API",
        "1",
        "What a tenant does with retrace: agents, cycles, what they produced. Every /v1 route "
        "needs the tenant's API key as a bearer token (/v1/admin: the operator's key) and sees "
        "only that tenant's objects; errors are `{error: {message, type, code}}`.",
        ROUTES,
        ErrorResponse,
    )
