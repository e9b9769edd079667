"""One diagnosis: propose candidate capabilities, apply the criterion, merge duplicates.

The deterministic catalogue always runs. With a judge configured, the judge proposes more
candidates and labels them (one call per trajectory and labelling run); rule-based candidates
keep their rules. Both go through the same criterion and one merge.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.contrast.config import ContrastConfig
from services.contrast.criterion import CapabilityStats, CriterionConfig, evaluate
from services.contrast.deterministic import RuleLabeller, propose
from services.contrast.judge import JudgeLabeller, JudgeProposer, criterion_runs
from services.contrast.labels import Capability, Label
from services.contrast.merge import merge
from services.contrast.trajectory import TrajectoryView


def criterion(cfg: ContrastConfig) -> CriterionConfig:
    return CriterionConfig(
        runs=cfg.runs,
        min_runs=cfg.min_runs,
        min_coverage=cfg.min_coverage,
        min_delta=cfg.min_delta,
        seed=cfg.seed,
    )


class _Mixed:
    """Rules where a capability has one, the judge's prelabelled answers otherwise."""

    def __init__(self, judge: JudgeLabeller | None) -> None:
        self.rules = RuleLabeller()
        self.judge = judge

    def label(self, capability: Capability, trajectory: TrajectoryView, run: int) -> Label:
        if capability.rule is not None or self.judge is None:
            return self.rules.label(capability, trajectory, run)
        return self.judge.label(capability, trajectory, run)


async def diagnose(
    trajectories: Sequence[TrajectoryView],
    cfg: ContrastConfig,
    *,
    proposer: JudgeProposer | None = None,
    judge: JudgeLabeller | None = None,
) -> list[CapabilityStats]:
    """Every candidate with its statistics, kept ones first (ranked by mean delta)."""
    if not trajectories:
        return []
    candidates = propose(trajectories)
    if proposer is not None and judge is not None:
        taken = {c.name for c in candidates}
        proposed = [c for c in await proposer.propose(trajectories) if c.name not in taken]
        await judge.prelabel(proposed, trajectories, criterion_runs(criterion(cfg)))
        candidates += proposed
    if not candidates:
        return []
    stats = evaluate(candidates, trajectories, _Mixed(judge), criterion(cfg))
    kept = merge([s for s in stats if s.kept])
    return kept + [s for s in stats if not s.kept]
