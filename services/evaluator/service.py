"""Wiring of the evaluator service: the cycle's handlers, the failure-rate monitor and the
stall watch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from services.evaluator.config import DEFAULT_PORT, EvaluatorConfig
from services.evaluator.handlers import EvaluatorHandlers
from services.evaluator.monitor import MonitorConfig, tick
from services.evaluator.stall import expire_stalled, limits
from shared.bus import NatsBus
from shared.logging import get_logger
from shared.runtime.service import Service
from shared.store import Store

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
    per_stage = {
        "requested": cfg.requested_stall_s,
        **{str(k): v for k, v in cfg.stage_stall_s.items()},
    }
    stall_s = limits(cfg.cycle_stall_s, per_stage)
    tasks: list[asyncio.Task[None]] = []

    def every(
        interval_s: float, what: str, check: Callable[[Store, NatsBus], Awaitable[object]]
    ) -> Callable[[Service], Coroutine[Any, Any, None]]:
        """A loop running `check` every `interval_s` once the store and bus are up; a failed
        pass is logged and the next one comes."""

        async def loop(service: Service) -> None:
            while True:
                await asyncio.sleep(interval_s)
                if service.store is None or service.bus is None:
                    continue
                try:
                    await check(service.store, service.bus)
                except Exception:
                    log.exception(f"{what} pass failed")

        return loop

    watch = every(
        monitor.interval_s, "failure-rate monitor", lambda store, bus: tick(store, bus, monitor)
    )
    stall_watch = every(
        cfg.stall_check_s,
        "stall watch",
        lambda store, bus: expire_stalled(store, bus, stall_s),
    )

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
