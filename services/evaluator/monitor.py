"""The failure-rate monitor: a cycle starts by itself when an agent's production gets worse.

Every `interval_s`, for every agent, the latest `window` production trajectories that have
feedback give a failure rate. The monitor fires when that rate reaches `threshold` over at
least `min_samples` outcomes, no cycle of the agent is active, and the last firing is more
than `cooldown_s` ago; after firing it stays disarmed until the rate falls below `rearm`
(hysteresis: one bad stretch starts one cycle, not one per tick). Firing publishes
`cycle.requested` (trigger `monitor`, the numbers as the reason) with a message id derived
from the evidence, so a tick that repeats after a crash is deduplicated. The monitor's state
lives in the agent's `config["monitor"]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy import select

from shared import cycle as machine
from shared.bus import NatsBus
from shared.logging import get_logger
from shared.messages import CycleRequested
from shared.store import Store
from shared.store.models import Agent, Cycle, Tenant, Trajectory

log = get_logger(__name__)


@dataclass(frozen=True)
class MonitorConfig:
    interval_s: float = 30.0
    window: int = 50
    min_samples: int = 20
    threshold: float = 0.5
    rearm: float = 0.4
    cooldown_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 <= self.rearm <= self.threshold <= 1:
            raise ValueError(f"need 0 <= rearm ({self.rearm}) <= threshold ({self.threshold}) <= 1")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(
                f"need 1 <= min_samples ({self.min_samples}) <= window ({self.window})"
            )


class MonitorState(msgspec.Struct, kw_only=True, frozen=True):
    armed: bool = True
    last_fired: float | None = None
    """Unix time of the last firing."""


@dataclass(frozen=True)
class Assessment:
    fire: bool
    state: MonitorState
    failure_rate: float | None
    samples: int
    why: str


def assess(
    outcomes: Sequence[bool], state: MonitorState, cfg: MonitorConfig, now: float, busy: bool
) -> Assessment:
    """What the monitor does with the window's outcomes (True: success), newest last."""
    window = list(outcomes)[-cfg.window :]
    n = len(window)
    if n < cfg.min_samples:
        return Assessment(False, state, None, n, f"{n} outcomes, fewer than {cfg.min_samples}")
    rate = sum(1 for ok in window if not ok) / n
    if not state.armed:
        if rate < cfg.rearm:
            return Assessment(
                False, msgspec.structs.replace(state, armed=True), rate, n, "re-armed"
            )
        return Assessment(False, state, rate, n, f"disarmed until below {cfg.rearm:.0%}")
    if rate < cfg.threshold:
        return Assessment(False, state, rate, n, "below threshold")
    if busy:
        return Assessment(False, state, rate, n, "a cycle is already active")
    if state.last_fired is not None and now - state.last_fired < cfg.cooldown_s:
        return Assessment(False, state, rate, n, "cooling down")
    why = (
        f"production failure rate {rate:.0%} over the last {n} conversations with feedback "
        f"reached the threshold {cfg.threshold:.0%}"
    )
    return Assessment(True, MonitorState(armed=False, last_fired=now), rate, n, why)


async def tick(store: Store, bus: NatsBus, cfg: MonitorConfig, now: float | None = None) -> int:
    """One pass over every agent of every tenant; returns how many cycles it requested."""
    now = time.time() if now is None else now
    async with store.cross_tenant() as session:
        tenants = list(await session.scalars(select(Tenant.id)))
    fired = 0
    for tenant in tenants:
        async with store.tenant(tenant) as session:
            agents = list(await session.scalars(select(Agent)))
            for agent in agents:
                rows = list(
                    await session.execute(
                        select(Trajectory.id, Trajectory.success)
                        .where(
                            Trajectory.agent_id == agent.id,
                            Trajectory.source == "production",
                            Trajectory.success.is_not(None),
                        )
                        .order_by(Trajectory.created_at.desc(), Trajectory.id.desc())
                        .limit(cfg.window)
                    )
                )
                busy = (
                    await session.scalar(
                        select(Cycle.id).where(
                            Cycle.agent_id == agent.id, Cycle.state.in_(machine.ACTIVE)
                        )
                    )
                    is not None
                )
                state = msgspec.convert((agent.config or {}).get("monitor", {}), MonitorState)
                result = assess([bool(ok) for _, ok in reversed(rows)], state, cfg, now, busy)
                if result.fire:
                    newest = rows[0][0]
                    await bus.publish(
                        tenant,
                        CycleRequested(
                            cycle_id=uuid.uuid5(uuid.NAMESPACE_URL, f"monitor/{agent.id}/{newest}"),
                            agent_id=agent.id,
                            trigger="monitor",
                            reason=result.why,
                        ),
                        msg_id=f"monitor/{agent.id}/{newest}",
                    )
                    fired += 1
                    log.warning(
                        "failure rate high: cycle requested", agent=agent.name, why=result.why
                    )
                if result.state != state:
                    agent.config = {
                        **(agent.config or {}),
                        "monitor": msgspec.to_builtins(result.state),
                    }
    return fired
