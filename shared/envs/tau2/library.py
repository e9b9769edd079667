"""Importing tau2 once, set up for offline, quiet use; a clear error when the extra is missing."""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from functools import cache
from types import ModuleType
from typing import Any

from shared.envs.registry import UnknownEnvironmentError
from shared.logging import get_logger

log = get_logger("tau2")
DOMAINS = ("airline", "retail", "telecom")
INSTALL = "pip install 'retrace[tau2]'"
# Warnings tau2 logs on every import or evaluation that say nothing about the episode: gold
# actions that fail by design (a lookup of a user who does not exist), unimplemented features.
_NOISE = (
    "No .env file found",
    "Sonnet thinking is disabled",
    "has no cost",
    "Error in golden actions",
    "not implemented for",
)


class Tau2UnavailableError(UnknownEnvironmentError):
    """The tau2 extra is not installed (or a domain name is not one of tau2's)."""


@cache
def require() -> None:
    """Import tau2 and litellm configured for retrace; raises Tau2UnavailableError without them."""
    # litellm downloads its model price map at import unless told to use its bundled copy, and
    # no code path of retrace may reach the internet.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger
    except ImportError as exc:
        raise Tau2UnavailableError(f"tau2 environments need the tau2 extra: {INSTALL}") from exc
    # tau2 logs through loguru at DEBUG to stderr; route its warnings into structlog instead,
    # before the first tau2 import (which already logs).
    logger.remove()
    logger.add(_to_structlog, level="WARNING", format="{message}")
    try:
        importlib.import_module("tau2.registry")
        import litellm
    except ImportError as exc:
        raise Tau2UnavailableError(
            f"tau2 environments need the tau2 extra: {INSTALL} ({exc})"
        ) from exc
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    # litellm logs every completion at INFO through its own handler; retrace logs the episode.
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # litellm's own response objects trip pydantic's serializer on every call: noise, not news.
    warnings.filterwarnings("ignore", "Pydantic serializer warnings", UserWarning)


def _to_structlog(message: Any) -> None:
    record = message.record
    text = str(record["message"])
    if not any(noise in text for noise in _NOISE):
        log.warning("tau2", message=text[:2000], level=record["level"].name)


def domain_module(domain: str) -> ModuleType:
    """`tau2.domains.<domain>.environment`: the domain's `get_environment`, tasks and splits."""
    if domain not in DOMAINS:
        raise Tau2UnavailableError(f"unknown tau2 domain {domain!r}; tau2 has {', '.join(DOMAINS)}")
    require()
    return importlib.import_module(f"tau2.domains.{domain}.environment")
