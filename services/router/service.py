"""Wiring of the router service."""

from __future__ import annotations

from services.router.config import DEFAULT_PORT, RouterConfig
from services.router.handlers import HANDLERS
from shared.runtime.service import Service

NAME = "router"


def build(cfg: RouterConfig) -> Service:
    return Service(NAME, cfg, HANDLERS, default_port=DEFAULT_PORT)
