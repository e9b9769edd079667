"""The stall watch: an active cycle that has not changed for its stage's limit is failed,
saying where it stopped (a stage whose message was dead-lettered, a worker pool that is
gone), so the agent can start a new cycle.

Each stage has its own limit (`EvaluatorConfig.stage_stall_s`, else `cycle_stall_s`): a
diagnosis that has not moved in an hour is stuck, a GRPO run on a CPU may take a day.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, or_, select

from shared import cycle as machine
from shared.bus import NatsBus
from shared.cycle import State
from shared.logging import get_logger
from shared.messages import CycleCompleted
from shared.store import Store
from shared.store.models import Cycle, Tenant

log = get_logger(__name__)


def limits(default_s: float, per_stage: Mapping[str, float]) -> dict[State, float]:
    """Each active stage's stall limit in seconds."""
    return {stage: float(per_stage.get(stage, default_s)) for stage in machine.ACTIVE}


async def expire_stalled(store: Store, bus: NatsBus, stall_s: Mapping[State, float]) -> int:
    """Fail the active cycles that have not moved within their stage's limit; how many."""
    now = datetime.now(UTC)
    stuck = or_(
        *(
            and_(Cycle.state == stage, Cycle.updated_at < now - timedelta(seconds=limit))
            for stage, limit in stall_s.items()
        )
    )
    async with store.cross_tenant() as session:
        tenants = list(await session.scalars(select(Tenant.id)))
    expired = 0
    for tenant in tenants:
        async with store.tenant(tenant) as session:
            stalled = list(await session.scalars(select(Cycle).where(stuck).with_for_update()))
            for cycle in stalled:
                stage = State(cycle.state)
                why = (
                    f"stalled in {stage} for more than {stall_s[stage]:.0f}s "
                    "(see `retrace status` for dead letters)"
                )
                machine.move(cycle, State.FAILED, machine.STALL)
                cycle.error = why
                cycle.reason = why
                await bus.publish(
                    tenant,
                    CycleCompleted(cycle_id=cycle.id, outcome="failed", reason=why),
                    msg_id=f"stalled/{cycle.id}",
                )
                expired += 1
                log.warning("cycle stalled: failed", cycle=str(cycle.id), why=why)
    return expired
