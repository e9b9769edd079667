"""Cycles: `data` by stage (`services/evaluator/state.py`) instead of one flat bag keyed by
string prefixes. Rewrites every cycle's data, both ways; self-contained (it must keep
working when the code's shape moves on).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 13:00:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROUTE = "route:"

cycles = sa.table(
    "cycles",
    sa.column("id", postgresql.UUID(as_uuid=True)),
    sa.column("data", postgresql.JSONB()),
)


def by_stage(old: dict[str, Any]) -> dict[str, Any]:
    """The flat shape (0001 to 0003) in the shape by stage; data already by stage is kept."""
    if not isinstance(old.get("diagnosis", ""), str):
        return old
    new: dict[str, Any] = {k: old[k] for k in ("settings", "untrained", "report") if k in old}
    if old.get("diagnosis"):
        early = {
            cap: {"environment": env, "reason": why or ""}
            for cap, (env, why) in (old.get("early_settlements") or {}).items()
        }
        new["diagnosis"] = {"request_id": old["diagnosis"], "early": early}
    if "capabilities" in old:
        failures = old.get("synthesis_failures") or {}
        new["synthesis"] = {
            "capabilities": old["capabilities"],
            "reserves": old.get("reserves") or [],
            "settled": {
                cap: {"environment": env, "reason": failures.get(cap, "")}
                for cap, env in (old.get("environments") or {}).items()
            },
        }
    if "jobs" in old:
        new["training"] = {
            "jobs": old["jobs"],
            "baselines": old.get("baseline_jobs") or {},
            "failures": old.get("training_failures") or {},
        }
    if "evaluations" in old:
        requests = old["evaluations"]
        new["evaluation"] = {
            "requests": {k: v for k, v in requests.items() if not k.startswith(ROUTE)},
            "route_requests": {
                k[len(ROUTE) :]: v for k, v in requests.items() if k.startswith(ROUTE)
            },
            "done": sorted(requests[k] for k in old.get("evaluated") or [] if k in requests),
            "adapters": old.get("adapters") or [],
            "production": old.get("production") or [],
        }
    return new


def flat(new: dict[str, Any]) -> dict[str, Any]:
    """The shape by stage back in the flat one."""
    if isinstance(new.get("diagnosis", ""), str):
        return new
    old: dict[str, Any] = {k: new[k] for k in ("settings", "untrained", "report") if k in new}
    diagnosis = new.get("diagnosis") or {}
    if diagnosis:
        old["diagnosis"] = diagnosis["request_id"]
        early = diagnosis.get("early") or {}
        if early:
            old["early_settlements"] = {
                cap: [s.get("environment"), s.get("reason", "")] for cap, s in early.items()
            }
    synthesis = new.get("synthesis")
    if synthesis:
        settled = synthesis.get("settled") or {}
        old["capabilities"] = synthesis["capabilities"]
        old["reserves"] = synthesis.get("reserves") or []
        old["environments"] = {cap: s.get("environment") for cap, s in settled.items()}
        old["synthesis_failures"] = {
            cap: s.get("reason", "") for cap, s in settled.items() if s.get("environment") is None
        }
    training = new.get("training")
    if training:
        old["jobs"] = training["jobs"]
        old["baseline_jobs"] = training.get("baselines") or {}
        old["training_failures"] = training.get("failures") or {}
    evaluation = new.get("evaluation")
    if evaluation:
        requests = {
            **evaluation["requests"],
            **{ROUTE + k: v for k, v in (evaluation.get("route_requests") or {}).items()},
        }
        done = set(evaluation.get("done") or [])
        old["evaluations"] = requests
        old["evaluated"] = sorted(k for k, v in requests.items() if v in done)
        old["adapters"] = evaluation.get("adapters") or []
        old["production"] = evaluation.get("production") or []
    return old


def _rewrite(convert: Any) -> None:
    bind = op.get_bind()
    for row in bind.execute(sa.select(cycles.c.id, cycles.c.data)).all():
        data = row.data or {}
        changed = convert(data)
        if changed != data:
            bind.execute(cycles.update().where(cycles.c.id == row.id).values(data=changed))


def upgrade() -> None:
    _rewrite(by_stage)


def downgrade() -> None:
    _rewrite(flat)
