"""Wiring of the train service."""

from __future__ import annotations

from services.train.config import DEFAULT_PORT, TrainConfig
from services.train.handlers import HANDLERS
from shared.runtime.service import Service

NAME = "train"


def build(cfg: TrainConfig) -> Service:
    return Service(NAME, cfg, HANDLERS, default_port=DEFAULT_PORT)
