"""One diagnosis: propose candidate capabilities, apply the criterion, merge duplicates."""

from __future__ import annotations

from collections.abc import Sequence

from services.contrast.config import ContrastConfig
from services.contrast.criterion import CapabilityStats, CriterionConfig, evaluate
from services.contrast.deterministic import RuleLabeller, propose
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


def diagnose(trajectories: Sequence[TrajectoryView], cfg: ContrastConfig) -> list[CapabilityStats]:
    """Every candidate with its statistics, kept ones first (ranked by mean delta)."""
    if not trajectories:
        return []
    candidates = propose(trajectories)
    if not candidates:
        return []
    stats = evaluate(candidates, trajectories, RuleLabeller(), criterion(cfg))
    kept = merge([s for s in stats if s.kept])
    return kept + [s for s in stats if not s.kept]
