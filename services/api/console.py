"""The console: what a tenant's cycles found and did, as web pages the control API serves.

Server-rendered HTML (no build step, no CDN: one stylesheet inline, charts as inline SVG, a
few lines of script for the live cycle page). A browser signs in with the tenant's API key,
kept in an HttpOnly, SameSite=Strict cookie; every page reads the store through a session
scoped to that key's tenant, as the API does, so another tenant's objects are "not found".

Pages: agents; an agent (its cycles and adapters); a cycle (a live timeline over the API's
event stream, the capability table with its coverage-vs-delta plot, the synthesized
environments with their calibration, training curves, the evaluation table with 95%
intervals and paired tests, routing against the oracle); a trajectory (the conversation
with its tool calls and results, and the reward breakdown).
"""

from __future__ import annotations

import html
import json
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import distinct_on

from shared.store.models import (
    Adapter,
    Agent,
    Capability,
    Cycle,
    Environment,
    Evaluation,
    Trajectory,
)
from shared.store.tenants import live_key, scope_refusal, well_formed

COOKIE = "retrace_key"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2230;background:#f6f7f9}
header{background:#1d2230;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:center}
header a{color:#cfd6e6;text-decoration:none}header b{color:#fff}
main{padding:1em 1.5em;max-width:1150px}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.2em;min-width:50%}
th,td{border:1px solid #dde1e8;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
.state{display:inline-block;padding:.1em .5em;border-radius:.6em;background:#e3e8f2}
.completed{background:#d5f0dc}.failed{background:#f6d6d6}
.msg{background:#fff;border:1px solid #dde1e8;border-radius:6px;margin:.5em 0;padding:.5em .8em}
.msg pre{white-space:pre-wrap;margin:.3em 0}.role{font-weight:600;color:#4a5470}
.tool{border-left:4px solid #8aa4d6}.assistant{border-left:4px solid #5cb07a}
.user{border-left:4px solid #d0a04a}.system{border-left:4px solid #999}
.timeline{display:flex;gap:.4em;margin:.6em 0}.timeline span{padding:.2em .6em;
border-radius:.5em;background:#e7eaf0;color:#778}.timeline span.on{background:#1d2230;color:#fff}
.timeline span.done{background:#cfe0cf;color:#234}
svg{background:#fff;border:1px solid #dde1e8}.muted{color:#778}
form.login{background:#fff;padding:1.5em;border:1px solid #dde1e8;max-width:420px}
input[type=password]{width:100%;padding:.4em;margin:.5em 0}
"""
STAGES = ("requested", "diagnosing", "synthesizing", "training", "evaluating", "completed")


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def missing(what: str) -> web.Response:
    """A page's 404, as a page (another tenant's object is missing like one that never was)."""
    response = page("Not found", f"<p>{esc(what)}</p>")
    response.set_status(404)
    return response


def page(title: str, body: str, signed_in: bool = True) -> web.Response:
    nav = (
        '<a href="/console/agents"><b>retrace</b></a><a href="/console/agents">agents</a>'
        '<form method="post" action="/console/logout" style="margin-left:auto">'
        '<button type="submit">sign out</button></form>'
        if signed_in
        else "<b>retrace</b>"
    )
    text = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)} · retrace"
        f'</title><meta name=viewport content="width=device-width"><style>{STYLE}</style>'
        f"</head><body><header>{nav}</header><main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )
    return web.Response(text=text, content_type="text/html")


def pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "-"


def num(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def table(head: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>" if rows else '<p class="muted">none yet</p>'


def line_chart(series: list[tuple[str, list[tuple[float, float]]]], x: str, y: str) -> str:
    """Lines on one plot, inline SVG (training curves)."""
    points = [p for _, s in series for p in s]
    if not points:
        return '<p class="muted">no curve yet</p>'
    w, h, pad = 560, 240, 40
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs) or 1.0
    y0, y1 = min(0.0, min(ys)), max(1.0, max(ys))

    def sx(v: float) -> float:
        return pad + (v - x0) / ((x1 - x0) or 1) * (w - 2 * pad)

    def sy(v: float) -> float:
        return h - pad - (v - y0) / ((y1 - y0) or 1) * (h - 2 * pad)

    colours = ("#3465a4", "#cc4c3b", "#4e9a06", "#a15ec4", "#c4a000")
    lines = []
    for i, (name, s) in enumerate(series):
        path = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in s)
        c = colours[i % len(colours)]
        lines.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{path}"/>'
            f'<text x="{w - pad + 4}" y="{pad + 14 * i}" font-size="11" fill="{c}">'
            f"{esc(name[:24])}</text>"
        )
    return (
        f'<svg width="{w + 150}" height="{h}" role="img" aria-label="{esc(y)} by {esc(x)}">'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#999"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#999"/>'
        f'<text x="{w / 2}" y="{h - 8}" font-size="11" text-anchor="middle">{esc(x)}</text>'
        f'<text x="12" y="{h / 2}" font-size="11" transform="rotate(-90 12 {h / 2})" '
        f'text-anchor="middle">{esc(y)}</text>'
        f'<text x="{pad - 4}" y="{sy(y1) + 4}" font-size="10" text-anchor="end">{y1:g}</text>'
        f'<text x="{pad - 4}" y="{sy(y0) + 4}" font-size="10" text-anchor="end">{y0:g}</text>'
        f'<text x="{sx(x1)}" y="{h - pad + 14}" font-size="10" text-anchor="end">{x1:g}</text>'
        + "".join(lines)
        + "</svg>"
    )


def scatter(points: list[tuple[str, float, float, bool]], x: str, y: str) -> str:
    """Labelled points (a capability's coverage against its delta), kept ones filled."""
    if not points:
        return '<p class="muted">nothing to plot yet</p>'
    w, h, pad = 560, 280, 44
    ys = [p[2] for p in points]
    y0, y1 = min(0.0, min(ys)), max(0.1, max(ys))

    def sx(v: float) -> float:
        return pad + v * (w - 2 * pad)

    def sy(v: float) -> float:
        return h - pad - (v - y0) / ((y1 - y0) or 1) * (h - 2 * pad)

    dots = "".join(
        f'<circle cx="{sx(a):.1f}" cy="{sy(b):.1f}" r="5" stroke="#3465a4" '
        f'fill="{"#3465a4" if kept else "#fff"}"><title>{esc(name)}</title></circle>'
        f'<text x="{sx(a) + 7:.1f}" y="{sy(b) + 4:.1f}" font-size="10">{esc(name[:28])}</text>'
        for name, a, b, kept in points
    )
    return (
        f'<svg width="{w + 120}" height="{h}" role="img" aria-label="{esc(y)} by {esc(x)}">'
        f'<line x1="{pad}" y1="{sy(0):.1f}" x2="{w - pad}" y2="{sy(0):.1f}" stroke="#999"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#999"/>'
        f'<text x="{w / 2}" y="{h - 8}" font-size="11" text-anchor="middle">{esc(x)}</text>'
        f'<text x="12" y="{h / 2}" font-size="11" transform="rotate(-90 12 {h / 2})" '
        f'text-anchor="middle">{esc(y)}</text>'
        f'<text x="{pad}" y="{h - pad + 14}" font-size="10" text-anchor="middle">0</text>'
        f'<text x="{w - pad}" y="{h - pad + 14}" font-size="10" text-anchor="middle">1</text>'
        f'<text x="{pad - 4}" y="{sy(y1) + 4:.1f}" font-size="10" text-anchor="end">{y1:.2g}</text>'
        f'<text x="{pad - 4}" y="{sy(0) + 4:.1f}" font-size="10" text-anchor="end">0</text>'
        f"{dots}</svg>"
    )


class Console:
    """The console's pages, on the control API's app (`store` is the API service's)."""

    def __init__(self, store: Callable[[], Any], events: Callable[..., Any]) -> None:
        self._store = store
        """The service's store, once it has started."""
        self.events = events
        """The API's cycle event stream handler (the live page follows it)."""

    @property
    def store(self) -> Any:
        return self._store()

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/console", self.home)
        r.add_get("/console/", self.home)
        r.add_get("/console/login", self.login_form)
        r.add_post("/console/login", self.login)
        r.add_post("/console/logout", self.logout)
        r.add_get("/console/agents", self.agents)
        r.add_get("/console/agents/{name}", self.agent)
        r.add_get("/console/cycles/{id}", self.cycle)
        r.add_get("/console/cycles/{id}/events", self.cycle_events)
        r.add_get("/console/trajectories/{id}", self.trajectory)

    # -- signing in ---------------------------------------------------------------------------

    async def tenant(self, request: web.Request) -> str:
        """The signed-in tenant, or a redirect to the sign-in page."""
        key = request.cookies.get(COOKIE, "")
        if key:
            tenant, _, _ = await self._signed_in(key)
            if tenant is not None:
                return tenant
        raise web.HTTPSeeOther("/console/login")

    async def _signed_in(self, key: str) -> tuple[str | None, str, int]:
        """The tenant `key` signs in, or None with why not and the status to answer (401
        unknown or revoked; 403 for a key whose scope does not reach the console: an
        application's `inference` key)."""
        async with self.store.cross_tenant() as session:
            row = await live_key(session, key) if well_formed(key) else None
        if row is None:
            return None, "unknown or revoked key", 401
        why = scope_refusal(row.scope, "console")
        return (row.tenant_id, "", 200) if why is None else (None, why, 403)

    async def home(self, request: web.Request) -> web.Response:
        await self.tenant(request)
        raise web.HTTPSeeOther("/console/agents")

    async def login_form(self, request: web.Request, failed: str = "") -> web.Response:
        note = f'<p class="failed state">{esc(failed)}</p>' if failed else ""
        return page(
            "Sign in",
            f'{note}<form class="login" method="post" action="/console/login">'
            "<label>Your tenant's API key<input type=password name=key autocomplete=off "
            'autofocus required></label><button type="submit">sign in</button>'
            '<p class="muted">The key stays in this browser (an HttpOnly cookie).</p></form>',
            signed_in=False,
        )

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        key = str(form.get("key", "")).strip()
        tenant, why, status = await self._signed_in(key)
        if tenant is None:
            response = await self.login_form(request, failed=why)
            response.set_status(status)
            return response
        response = web.HTTPSeeOther("/console/agents")
        response.set_cookie(
            COOKIE,
            key,
            httponly=True,
            samesite="Strict",
            secure=request.secure,
            path="/console",
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        response = web.HTTPSeeOther("/console/login")
        response.del_cookie(COOKIE, path="/console")
        raise response

    # -- pages --------------------------------------------------------------------------------

    async def agents(self, request: web.Request) -> web.Response:
        tenant = await self.tenant(request)
        async with self.store.tenant(tenant) as session:
            agents = list(await session.scalars(select(Agent).order_by(Agent.name)))
            newest = (  # each agent's latest cycle, not every cycle
                select(Cycle)
                .ext(distinct_on(Cycle.agent_id))
                .order_by(Cycle.agent_id, Cycle.created_at.desc())
            )
            latest = {c.agent_id: c for c in await session.scalars(newest)}
        rows = [
            [
                f'<a href="/console/agents/{esc(a.name)}">{esc(a.name)}</a>',
                esc(a.model),
                esc(a.environment),
                str(len(a.production_adapters or [])),
                _cycle_link(latest.get(a.id)),
            ]
            for a in agents
        ]
        return page(
            f"Agents of {tenant}",
            table(["agent", "model", "environment", "adapters serving", "latest cycle"], rows),
        )

    async def agent(self, request: web.Request) -> web.Response:
        tenant = await self.tenant(request)
        name = request.match_info["name"]
        async with self.store.tenant(tenant) as session:
            agent = await session.scalar(select(Agent).where(Agent.name == name))
            if agent is None:
                return missing(f"no agent {name!r}")
            cycles = list(
                await session.scalars(
                    select(Cycle)
                    .where(Cycle.agent_id == agent.id)
                    .order_by(Cycle.created_at.desc())
                )
            )
            adapters = list(
                await session.scalars(
                    select(Adapter)
                    .where(Adapter.agent_id == agent.id)
                    .order_by(Adapter.created_at.desc())
                )
            )
        serving = {str(a) for a in agent.production_adapters or []}
        body = (
            f"<p>model <b>{esc(agent.model)}</b> on <b>{esc(agent.environment)}</b></p>"
            + (f"<pre>{esc(agent.system_prompt)}</pre>" if agent.system_prompt else "")
            + "<h2>Cycles</h2>"
            + table(
                ["cycle", "state", "trigger", "started", "reason"],
                [
                    [
                        _cycle_link(c),
                        _state(c.state),
                        esc(c.trigger),
                        esc(f"{c.created_at:%Y-%m-%d %H:%M}"),
                        esc(c.reason),
                    ]
                    for c in cycles
                ],
            )
            + "<h2>Adapters</h2>"
            + table(
                ["adapter", "status", "serving", "held-out gain [95% CI]", "steps"],
                [
                    [
                        esc(a.name),
                        esc(a.status),
                        "yes" if str(a.id) in serving else "",
                        _heldout(a.heldout),
                        str(len(a.training_curve or [])),
                    ]
                    for a in adapters
                ],
            )
        )
        return page(f"Agent {agent.name}", body)

    async def cycle(self, request: web.Request) -> web.Response:
        tenant = await self.tenant(request)
        cycle_id = _uuid(request.match_info["id"])
        async with self.store.tenant(tenant) as session:
            cycle = await session.get(Cycle, cycle_id) if cycle_id else None
            if cycle is None or cycle_id is None:
                return missing(f"no cycle {request.match_info['id'][:80]}")
            agent = await session.get(Agent, cycle.agent_id)
            capabilities = list(
                await session.scalars(
                    select(Capability)
                    .where(Capability.cycle_id == cycle_id)
                    .order_by(Capability.created_at)
                )
            )
            environments = list(
                await session.scalars(
                    select(Environment)
                    .where(Environment.capability_id.in_([c.id for c in capabilities]))
                    .order_by(Environment.created_at)
                )
            )
            episodes = {e.id: await _episodes(session, cycle_id, e.id) for e in environments}
            adapters = list(
                await session.scalars(
                    select(Adapter).where(Adapter.cycle_id == cycle_id).order_by(Adapter.created_at)
                )
            )
            rollouts = await session.scalar(
                select(func.count()).select_from(Trajectory).where(Trajectory.cycle_id == cycle_id)
            )
            per_task = {
                e.configuration: {
                    str(r["task"]): r["successes"] / r["trials"]
                    for r in e.results or []
                    if isinstance(r, dict) and r.get("trials")
                }
                for e in await session.scalars(
                    select(Evaluation).where(Evaluation.cycle_id == cycle_id)
                )
            }
            examples = list(
                await session.scalars(
                    select(Trajectory)
                    .where(Trajectory.cycle_id == cycle_id)
                    .order_by(Trajectory.created_at)
                    .limit(12)
                )
            )
        report = (cycle.data or {}).get("report") or {}
        names = {c.id: c.name for c in capabilities}
        body = (
            f'<p>agent <a href="/console/agents/{esc(agent.name if agent else "")}">'
            f"{esc(agent.name if agent else '?')}</a> · {rollouts or 0} rollouts recorded</p>"
            + _timeline(cycle.state)
            + f'<p id="live" class="muted">{esc(cycle.reason or cycle.error or "")}</p>'
            + "<h2>Capabilities</h2>"
            + _capabilities(capabilities)
            + "<h2>Training environments</h2>"
            + _environments(environments, names, episodes)
            + "<h2>Training</h2>"
            + _training(adapters)
            + "<h2>Evaluation</h2>"
            + _evaluation(report)
            + "<h2>Routing against the oracle</h2>"
            + _routing(report, per_task)
            + "<h2>Trajectories</h2>"
            + table(
                ["trajectory", "source", "model", "reward", "success"],
                [
                    [
                        f'<a href="/console/trajectories/{t.id}">{str(t.id)[:8]}</a>',
                        esc(t.source),
                        esc(t.model),
                        num(t.reward),
                        "" if t.success is None else ("yes" if t.success else "no"),
                    ]
                    for t in examples
                ],
                {3},
            )
            + (_live_script(cycle_id) if cycle.state not in ("completed", "failed") else "")
        )
        return page(f"Cycle {str(cycle_id)[:8]}", body)

    async def cycle_events(self, request: web.Request) -> web.StreamResponse:
        from services.api.handlers import TENANT

        request[TENANT] = await self.tenant(request)
        response: web.StreamResponse = await self.events(request)
        return response

    async def trajectory(self, request: web.Request) -> web.Response:
        tenant = await self.tenant(request)
        trajectory_id = _uuid(request.match_info["id"])
        async with self.store.tenant(tenant) as session:
            t = await session.get(Trajectory, trajectory_id) if trajectory_id else None
            if t is None:
                return missing(f"no trajectory {request.match_info['id'][:80]}")
        head = (
            f"<p>{esc(t.source)} · model {esc(t.model)} · reward {num(t.reward)} · success "
            f"{'-' if t.success is None else ('yes' if t.success else 'no')} · {t.tokens} "
            f"tokens</p>"
            + (f'<p><a href="/console/cycles/{t.cycle_id}">its cycle</a></p>' if t.cycle_id else "")
        )
        messages = "".join(_message(m) for m in t.messages or [])
        breakdown = (
            f"<h2>Reward breakdown</h2><pre>{esc(json.dumps(t.reward_breakdown, indent=2))}</pre>"
            if t.reward_breakdown
            else ""
        )
        return page(f"Trajectory {str(t.id)[:8]}", head + messages + breakdown)


def _uuid(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


def _state(state: str) -> str:
    return f'<span class="state {esc(state)}">{esc(state)}</span>'


def _cycle_link(cycle: Cycle | None) -> str:
    if cycle is None:
        return '<span class="muted">none</span>'
    return f'<a href="/console/cycles/{cycle.id}">{str(cycle.id)[:8]}</a> {_state(cycle.state)}'


def _timeline(state: str) -> str:
    reached = STAGES.index(state) if state in STAGES else -1
    spans = []
    for i, stage in enumerate(STAGES):
        kind = "on" if i == reached else ("done" if i < reached else "")
        spans.append(f'<span data-stage="{stage}" class="{kind}">{stage}</span>')
    if state == "failed":
        spans.append('<span class="on failed">failed</span>')
    return f'<div class="timeline" id="timeline">{"".join(spans)}</div>'


def _heldout(h: dict[str, Any] | None) -> str:
    if not h:
        return '<span class="muted">-</span>'
    low, high = h.get("ci95", [None, None])
    return f"{num(h.get('gain'), '+.3f')} [{num(low, '+.3f')}, {num(high, '+.3f')}]"


def _capabilities(rows: list[Capability]) -> str:
    out = table(
        ["capability", "status", "coverage", "delta", "runs passed", "definition", "examples"],
        [
            [
                esc(c.name),
                esc(c.status),
                num((c.statistics or {}).get("coverage")),
                num((c.statistics or {}).get("delta"), "+.3f"),
                f"{esc((c.statistics or {}).get('runs_passed', '-'))}/"
                f"{esc((c.statistics or {}).get('runs', '-'))}",
                esc(c.definition),
                " ".join(
                    f'<a href="/console/trajectories/{esc(t)}">{esc(str(t)[:8])}</a>'
                    for t in ((c.evidence or {}).get("failed_examples") or [])[:3]
                ),
            ]
            for c in rows
        ],
        {2, 3},
    )
    points = [
        (c.name, float(s["coverage"]), float(s["delta"]), c.status != "rejected")
        for c in rows
        if isinstance((s := c.statistics or {}).get("coverage"), int | float)
        and isinstance(s.get("delta"), int | float)
    ]
    return out + scatter(points, "coverage (share of failures lacking it)", "delta")


async def _episodes(
    session: Any, cycle_id: uuid.UUID, environment_id: uuid.UUID
) -> list[Trajectory]:
    """A synthetic environment's example episodes in the cycle (its calibration's): two that
    succeeded and two that failed, the first of each (read by the cycle's index)."""
    out: list[Trajectory] = []
    for success in (True, False):
        out += await session.scalars(
            select(Trajectory)
            .where(
                Trajectory.cycle_id == cycle_id,
                Trajectory.environment_id == environment_id,
                Trajectory.success.is_(success),
            )
            .order_by(Trajectory.created_at)
            .limit(2)
        )
    return out


def _environments(
    rows: list[Environment],
    names: dict[uuid.UUID, str],
    episodes: dict[uuid.UUID, list[Trajectory]],
) -> str:
    return table(
        ["environment", "capability", "status", "calibration", "example episodes"],
        [
            [
                esc(f"{e.name}@{e.version}"),
                esc(names.get(e.capability_id, "") if e.capability_id else ""),
                esc(e.status),
                "<br>".join(
                    f"{esc(k)}: {esc(num(v) if isinstance(v, float) else v)}"
                    for k, v in (e.calibration or {}).items()
                    if not isinstance(v, dict | list)
                ),
                "<br>".join(
                    f'<a href="/console/trajectories/{t.id}">{str(t.id)[:8]}</a> '
                    f"{'passed' if t.success else 'failed'} ({num(t.reward)})"
                    for t in episodes.get(e.id, [])
                )
                or '<span class="muted">none stored</span>',
            ]
            for e in rows
        ],
    )


def _training(adapters: list[Adapter]) -> str:
    series = []
    for a in adapters:
        curve = [
            (float(p.get("rollouts", i)), float(p["mean_reward"]))
            for i, p in enumerate(a.training_curve or [])
            if isinstance(p, dict) and isinstance(p.get("mean_reward"), int | float)
        ]
        series.append((a.name, curve))
    return table(
        ["adapter", "status", "steps", "held-out gain [95% CI]"],
        [
            [esc(a.name), esc(a.status), str(len(a.training_curve or [])), _heldout(a.heldout)]
            for a in adapters
        ],
    ) + line_chart(series, "rollouts spent", "mean reward per step")


def _evaluation(report: dict[str, Any]) -> str:
    configs = report.get("configs") or {}
    if not configs:
        return '<p class="muted">not evaluated yet</p>'
    spent = report.get("rollouts_spent") or {}
    walls = report.get("training_wall_s") or {}
    rows = []
    for name, s in configs.items():
        ks = [k for k in (s.get("pass_hat_k") or {}) if str(k).isdigit()]
        k = max(ks, key=int) if ks else "0"
        low, high = (s.get("ci95") or [None, None])[:2]
        rows.append(
            [
                esc(name),
                esc(s.get("episodes", "-")),
                pct(s.get("pass_rate")),
                f"[{pct(low)}, {pct(high)}]",
                num(s.get("mean_reward")),
                f"k={esc(k)}: {pct((s.get('pass_hat_k') or {}).get(k))}" if k != "0" else "-",
                esc(spent.get(name, 0)),
                _duration(walls.get(name)),
            ]
        )
    c = report.get("comparison") or {}
    verdict = report.get("verdict") or {}
    tests = (
        f"<p>routed vs {esc(report.get('incumbent', 'base'))}: {num(c.get('diff'), '+.3f')} per "
        f"task [{num((c.get('diff_ci95') or [None])[0], '+.3f')}, "
        f"{num((c.get('diff_ci95') or [None, None])[1], '+.3f')}], McNemar p="
        f"{num(c.get('mcnemar_p'), '.3g')}, paired bootstrap p={num(c.get('bootstrap_p'), '.3g')}"
        "</p>"
        if c
        else ""
    )
    for name, v in (report.get("baselines") or {}).items():
        tests += (
            f"<p>routed vs {esc(name)} (same rollout budget): {num(v.get('diff'), '+.3f')} "
            f"per task, McNemar p={num(v.get('mcnemar_p'), '.3g')}</p>"
        )
    decided = (
        f"<p><b>{'promoted' if verdict.get('promote') else 'kept'}</b>: "
        f"{esc(verdict.get('reason', ''))}</p>"
        if verdict
        else ""
    )
    return (
        table(
            [
                "configuration",
                "episodes",
                "pass rate",
                "95% CI",
                "mean reward",
                "pass^k",
                "training rollouts",
                "training wall time",
            ],
            rows,
            {1, 2, 4, 6, 7},
        )
        + tests
        + decided
    )


def _duration(seconds: object) -> str:
    """Seconds as "1h02m", "3m05s" or "12.5s" ("-" when not recorded)."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


def _routing(report: dict[str, Any], results: dict[str, dict[str, float]]) -> str:
    """Each test task: the configuration routing chose, how it did there, and the best any
    played configuration did there (the oracle's pick), from the evaluation's per-task rows
    (`results`: configuration -> task -> success rate)."""
    decisions = report.get("routing") or {}
    if not isinstance(decisions, dict) or not decisions:
        return '<p class="muted">not routed yet</p>'
    oracle = report.get("oracle")
    head = (
        f"<p>oracle routing ceiling {pct(oracle.get('pass_rate'))}</p>"
        if isinstance(oracle, dict)
        else '<p class="muted">oracle ceiling not measured (adapters played only where '
        "routed): the best below is among the configurations played on each task</p>"
    )
    candidates = {k: v for k, v in results.items() if k == "base" or k.startswith("adapter:")}
    rows = []
    agree = 0
    for task, chosen in sorted(decisions.items()):
        played = {name: r[task] for name, r in candidates.items() if task in r}
        best = max(played, key=lambda n: played[n]) if played else None
        top = played.get(best, 0.0) if best else 0.0
        ok = best is not None and played.get(str(chosen), -1.0) >= top
        agree += ok
        rows.append(
            [
                esc(task[:40]),
                esc(chosen),
                pct(played.get(str(chosen))),
                esc(best or "-"),
                pct(top if best else None),
                "yes" if ok else "no",
            ]
        )
    summary = (
        f"<p>routing matched the best played configuration on {agree} of {len(rows)} tasks</p>"
    )
    return (
        head
        + summary
        + table(
            ["task", "routed to", "its success", "best played", "best's success", "as good"],
            rows[:100],
            {2, 4},
        )
    )


def _message(m: Any) -> str:
    if not isinstance(m, dict):
        return f'<div class="msg"><pre>{esc(m)}</pre></div>'
    role = str(m.get("role", "?"))
    parts = []
    if m.get("content"):
        parts.append(f"<pre>{esc(m['content'])}</pre>")
    for call in m.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        parts.append(f"<pre>→ {esc(fn.get('name', '?'))}({esc(fn.get('arguments', ''))})</pre>")
    label = esc(role) + (f" ({esc(m['name'])})" if m.get("name") else "")
    return f'<div class="msg {esc(role)}"><span class="role">{label}</span>{"".join(parts)}</div>'


def _live_script(cycle_id: uuid.UUID) -> str:
    """The timeline and the note under it follow the cycle's event stream; the page reloads
    once the cycle ends, to show what it produced (a page of an ended cycle has no script)."""
    return (
        "<script>(function(){var s=new EventSource('/console/cycles/"
        f"{cycle_id}/events');var stages={json.dumps(list(STAGES))};"
        "s.addEventListener('cycle',function(e){var c=JSON.parse(e.data);"
        "var at=stages.indexOf(c.state);"
        "document.querySelectorAll('#timeline span[data-stage]').forEach(function(el,i){"
        "el.className=i===at?'on':(i<at?'done':'');});"
        "var work=(c.work||[]).map(function(w){return w.kind+' '+w.label+': '+w.done+'/'+"
        "w.total+' '+w.unit;}).join(' · ');"
        "document.getElementById('live').textContent=c.state+(work?' · '+work:'')+"
        "(c.reason?' · '+c.reason:'');"
        "if(c.state==='completed'||c.state==='failed'){s.close();"
        "setTimeout(function(){location.reload();},500);}});})();</script>"
    )
