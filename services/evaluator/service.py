"""Wiring of the evaluator service: the cycle's handlers, the failure-rate monitor and the
stall watch."""

from __future__ import annotations

import asyncio
import contextlib

from services.evaluator.config import DEFAULT_PORT, EvaluatorConfig
from services.evaluator.handlers import EvaluatorHandlers
from services.evaluator.monitor import MonitorConfig, tick
from services.evaluator.stall import expire_stalled, limits
from shared.logging import get_logger
from shared.runtime.service import Service

NAME = "evaluator"
log = get_logger(__name__)


def build(cfg: EvaluatorConfig) -> Service:
    monitor = MonitorConfig(
        interval_s=cfg.monitor_interval_s,
        window=cfg.monitor_window,
        min_samples=cfg.monitor_min_samples,
        threshold=cfg.monitor_threshold,
        rearm=cfg.monitor_rearm,
        cooldown_s=cfg.monitor_cooldown_s,
    )
    stall_s = limits(cfg.cycle_stall_s, {str(k): v for k, v in cfg.stage_stall_s.items()})
    tasks: list[asyncio.Task[None]] = []

    async def watch(service: Service) -> None:
        while True:
            await asyncio.sleep(monitor.interval_s)
            if service.store is None or service.bus is None:
                continue
            try:
                await tick(service.store, service.bus, monitor)
            except Exception:
                log.exception("failure-rate monitor pass failed")

    async def stall_watch(service: Service) -> None:
        while True:
            await asyncio.sleep(cfg.stall_check_s)
            if service.store is None or service.bus is None:
                continue
            try:
                await expire_stalled(service.store, service.bus, stall_s)
            except Exception:
                log.exception("stall watch pass failed")

    async def start(service: Service) -> None:
        if monitor.interval_s > 0:
            tasks.append(asyncio.create_task(watch(service), name="failure-rate-monitor"))
        tasks.append(asyncio.create_task(stall_watch(service), name="stall-watch"))

    async def stop(_: Service) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return Service(
        NAME,
        cfg,
        EvaluatorHandlers(cfg).table(),
        default_port=DEFAULT_PORT,
        on_start=start,
        on_stop=stop,
    )
