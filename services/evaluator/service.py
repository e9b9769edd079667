"""Wiring of the evaluator service."""

from __future__ import annotations

from services.evaluator.config import DEFAULT_PORT, EvaluatorConfig
from services.evaluator.handlers import HANDLERS
from shared.runtime.service import Service

NAME = "evaluator"


def build(cfg: EvaluatorConfig) -> Service:
    return Service(NAME, cfg, HANDLERS, default_port=DEFAULT_PORT)
