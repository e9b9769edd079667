"""Wiring of the rollout service."""

from __future__ import annotations

from services.rollout.config import DEFAULT_PORT, RolloutConfig
from services.rollout.handlers import HANDLERS
from shared.runtime.service import Service

NAME = "rollout"


def build(cfg: RolloutConfig) -> Service:
    return Service(NAME, cfg, HANDLERS, default_port=DEFAULT_PORT)
