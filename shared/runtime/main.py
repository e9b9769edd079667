"""Process entry point shared by every service's `__main__`: config, logging, run, exit code."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TypeVar

from shared.config import ServiceConfig, load_config
from shared.errors import ConfigError, EmbeddedServerError
from shared.logging import configure_logging, get_logger
from shared.runtime.service import Service

C = TypeVar("C", bound=ServiceConfig)


def run_service(name: str, config_cls: type[C], build: Callable[[C], Service]) -> None:
    """Load `config_cls` from the environment, build the service and run it until stopped."""
    try:
        cfg = load_config(config_cls, service=name)
    except ConfigError as exc:
        configure_logging()
        get_logger(name).error("configuration rejected", error=str(exc))
        sys.exit(2)
    configure_logging(cfg.log.level, cfg.log.format, service=name)
    cfg.environments.apply()  # this process's environment connections
    try:
        service = build(cfg)
    except ConfigError as exc:  # what the settings name is unusable (a routing pack, say)
        get_logger(name).error("configuration rejected", error=str(exc))
        sys.exit(2)
    try:
        code = asyncio.run(service.run(freeze_start_up=True))
    except EmbeddedServerError as exc:
        get_logger(name).error("embedded server failed", error=str(exc))
        code = 1
    sys.exit(code)
