"""Wiring of the control API service."""

from __future__ import annotations

from services.api.config import DEFAULT_PORT, ApiConfig
from services.api.handlers import ApiApp
from shared.runtime.service import Service

NAME = "api"


def build(cfg: ApiConfig) -> Service:
    app = ApiApp(cfg)
    service = Service(NAME, cfg, {}, default_port=DEFAULT_PORT, routes=app.routes)
    app.attach(service)
    return service
