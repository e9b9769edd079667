"""The HTTP side of a service: `/healthz` and `/metrics`, plus any routes the service adds."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared.llm.errors_http import carries_key, openai_error
from shared.runtime.metrics import ServiceMetrics

ACTING_FOR = "Retrace-Tenant"
"""The control API's header naming the tenant a request made with the operator's key acts
for (the CLI's tenant-level commands); beside a tenant's own key it means nothing."""
MAX_BODY_BYTES = 1 << 20
"""Largest request body a service's HTTP port reads by default (aiohttp's own default)."""
MIN_GRACE_S = 0.001
"""The shortest shutdown grace aiohttp is given: it waits without limit for 0."""


class Health(msgspec.Struct, kw_only=True):
    """GET /healthz body."""

    service: str
    status: str
    """ok | degraded | starting | stopping"""
    nats: bool | None
    """None: the service does not use NATS."""
    database: bool
    in_flight: int
    consumers: list[str]
    uptime_s: float
    pid: int


def build_app(
    metrics: ServiceMetrics,
    health: Callable[[], Awaitable[Health]],
    routes: Callable[[web.Application], None] | None = None,
    metrics_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)

    async def healthz(_: web.Request) -> web.Response:
        report = await health()
        return web.Response(
            body=msgspec.json.encode(report),
            status=200 if report.status == "ok" else 503,
            content_type="application/json",
        )

    async def prometheus(request: web.Request) -> web.Response:
        if metrics_key is not None and not carries_key(request, metrics_key):
            return openai_error(401, "/metrics needs its key", "authentication_error")
        if metrics_key is None and not _local(request.remote):
            # the router's metrics name tenants' adapters: not for anyone who reaches the port
            return openai_error(
                403,
                "/metrics without a key is for this machine only: set "
                "RETRACE_HTTP_METRICS_KEY to read it from elsewhere",
                "permission_error",
            )
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    if routes is not None:
        routes(app)
    return app


def loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is reachable from this machine only; a
    host name is taken to be reachable from elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _local(remote: str | None) -> bool:
    """Whether a peer is this machine: a loopback address (an IPv4 one inside IPv6 too), or
    a Unix socket (no address)."""
    if not remote:
        return True
    address = remote.split("%", 1)[0]  # a link-local peer's zone
    try:
        mapped = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        address = str(mapped.ipv4_mapped)
    return address != "localhost" and loopback(address)


async def listen(
    app: web.Application,
    host: str,
    port: int,
    *,
    idle_timeout_s: float,
    shutdown_timeout: float = 60.0,
    reuse_port: bool = False,
    cancel_on_disconnect: bool = False,
) -> web.AppRunner:
    """`app` served on `host:port` (0: a free port, see `runner.addresses`); a connection
    that holds no whole request for `idle_timeout_s` is closed (`shared.runtime.deadlines`).
    With `reuse_port`, several processes listen on the one port and the kernel shares the
    connections among them. With `cancel_on_disconnect`, a handler whose caller has gone is
    cancelled (a proxy then stops the work it asked of its upstream).

    At stop, requests in flight get `shutdown_timeout` seconds; aiohttp reads 0 as no limit
    at all, so 0 here means what it says (a millisecond)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=max(shutdown_timeout, MIN_GRACE_S),
        keepalive_timeout=idle_timeout_s,
        handler_cancellation=cancel_on_disconnect,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port).start()
    return runner


def uptime_since(start: float) -> float:
    return round(time.monotonic() - start, 3)
