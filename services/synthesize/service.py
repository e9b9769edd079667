"""Wiring of the synthesize service."""

from __future__ import annotations

from services.synthesize.config import DEFAULT_PORT, SynthesizeConfig
from services.synthesize.handlers import HANDLERS
from shared.runtime.service import Service

NAME = "synthesize"


def build(cfg: SynthesizeConfig) -> Service:
    return Service(NAME, cfg, HANDLERS, default_port=DEFAULT_PORT)
