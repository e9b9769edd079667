"""Wiring of the synthesize service."""

from __future__ import annotations

from services.synthesize.config import DEFAULT_PORT, SynthesizeConfig
from services.synthesize.handlers import SynthesizeHandlers
from shared.runtime.service import Service

NAME = "synthesize"


def build(cfg: SynthesizeConfig) -> Service:
    return Service(NAME, cfg, SynthesizeHandlers(cfg).table(), default_port=DEFAULT_PORT)
