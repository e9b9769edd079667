"""Wiring of the contrast service."""

from __future__ import annotations

from services.contrast.config import DEFAULT_PORT, ContrastConfig
from services.contrast.handlers import ContrastHandlers
from shared.runtime.service import Service

NAME = "contrast"


def build(cfg: ContrastConfig) -> Service:
    return Service(NAME, cfg, ContrastHandlers(cfg).table(), default_port=DEFAULT_PORT)
