"""Wiring of the router service."""

from __future__ import annotations

from aiohttp import web

from services.router.config import DEFAULT_PORT, RouterConfig
from services.router.handlers import RouterApp
from services.router.openapi import router_openapi
from shared import openapi
from shared.runtime.service import Service

NAME = "router"


def build(cfg: RouterConfig) -> Service:
    app = RouterApp(cfg)

    def routes(web_app: web.Application) -> None:
        app.routes(web_app)
        openapi.serve(web_app, router_openapi())

    service = Service(
        NAME,
        cfg,
        {},
        default_port=DEFAULT_PORT,
        routes=routes,
        on_start=app.start,
        on_stop=app.close,
    )
    app.attach(service)
    return service
