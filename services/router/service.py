"""Wiring of the router service."""

from __future__ import annotations

from services.router.config import DEFAULT_PORT, RouterConfig
from services.router.handlers import RouterApp
from shared.runtime.service import Service

NAME = "router"


def build(cfg: RouterConfig) -> Service:
    app = RouterApp(cfg)
    service = Service(
        NAME,
        cfg,
        {},
        default_port=DEFAULT_PORT,
        routes=app.routes,
        on_start=app.start,
        on_stop=app.close,
        max_body_bytes=cfg.max_body_bytes,
        uses_bus=False,  # nothing a chat needs goes over NATS: it may be away
    )
    app.attach(service)
    return service
