"""Handlers of the contrast service: one async function per consumed contract."""

from __future__ import annotations

import uuid

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.contrast.config import ContrastConfig
from services.contrast.criterion import CapabilityStats
from services.contrast.deterministic import CATALOGUE
from services.contrast.diagnosis import diagnose, similarity
from services.contrast.judge import JudgeConfig, JudgeLabeller, JudgeProposer
from services.contrast.references import reference_views
from services.contrast.trajectory import MalformedTrajectoryError, TrajectoryView
from shared.bus.delivery import Handler, HandlerContext, long_running
from shared.llm.client import LLMClient
from shared.logging import get_logger
from shared.messages import CapabilitiesIdentified, Contract, RolloutCompleted
from shared.store.models import Capability, Cycle, Task, Trajectory

log = get_logger(__name__)


class ContrastHandlers:
    def __init__(self, cfg: ContrastConfig, client: LLMClient | None = None) -> None:
        self.cfg = cfg
        self.similarity = similarity(cfg)
        self.proposer: JudgeProposer | None = None
        self.judge: JudgeLabeller | None = None
        if cfg.judge_model and client is not None:
            judge_cfg = JudgeConfig(
                model=cfg.judge_model, concurrency=cfg.judge_concurrency, seed=cfg.seed
            )
            self.proposer = JudgeProposer(client, judge_cfg)
            self.judge = JudgeLabeller(client, judge_cfg)

    def table(self) -> dict[type[Contract], Handler]:
        return {RolloutCompleted: self.rollout_completed}

    @long_running
    async def rollout_completed(self, msg: RolloutCompleted, ctx: HandlerContext) -> None:
        """A diagnosis rollout is stored: name what its failures lack. The judge (when one is
        configured) works outside any transaction; the capabilities and the message that
        announces them are recorded together."""
        if msg.purpose != "diagnose":
            return
        async with ctx.store.tenant(ctx.tenant) as session:
            views, skipped = await self._trajectories(session, msg.request_id)
            references: list[TrajectoryView] = []
            few = sum(v.success for v in views) < self.cfg.min_successes
            if few:
                failed = {v.task_id for v in views if not v.success}
                references = await reference_views(session, msg.request_id, failed)
        if few:
            log.info(
                "few successes: reference solutions join the contrast",
                request=str(msg.request_id),
                successes=sum(v.success for v in views),
                references=len(references),
            )
        results = await diagnose(
            [*views, *references],
            self.cfg,
            proposer=self.proposer,
            judge=self.judge,
            text_similarity=self.similarity,
        )
        async with ctx.record() as session:
            kept = await self._store(session, msg, results, views, references, skipped)
            limit = await _capability_limit(session, msg.cycle_id)
            reserves: list[uuid.UUID] = []
            if limit is not None and len(kept) > limit:
                log.info(
                    "cycle budget: only the best capabilities go on", kept=len(kept), limit=limit
                )
                kept, reserves = kept[:limit], kept[limit:]
            log.info(
                "diagnosis done",
                request=str(msg.request_id),
                trajectories=len(views),
                candidates=len(results),
                kept=len(kept),
            )
            ctx.emit(
                CapabilitiesIdentified(
                    agent_id=msg.agent_id,
                    capability_ids=kept,
                    cycle_id=msg.cycle_id,
                    request_id=msg.request_id,
                    reserve_ids=reserves,
                )
            )

    async def _store(
        self,
        session: AsyncSession,
        msg: RolloutCompleted,
        results: list[CapabilityStats],
        views: list[TrajectoryView],
        references: list[TrajectoryView],
        skipped: int,
    ) -> list[uuid.UUID]:
        """The candidates as capability rows; the ids of the kept ones, best first."""
        kept: list[uuid.UUID] = []
        for stats in results:
            row = Capability(
                agent_id=msg.agent_id,
                cycle_id=msg.cycle_id,
                name=stats.name,
                definition=stats.definition,
                status="identified" if stats.kept else "rejected",
                statistics={
                    k: v
                    for k, v in msgspec.to_builtins(stats).items()
                    if k
                    not in (
                        "name",
                        "definition",
                        "failed_examples",
                        "succeeded_examples",
                        "failures_covered",
                        "merged",
                    )
                },
                evidence={
                    "request_id": str(msg.request_id),
                    "labeller": "judge"
                    if self.judge and not _rule_based(stats.name)
                    else "deterministic",
                    "failed_examples": stats.failed_examples,
                    "succeeded_examples": stats.succeeded_examples,
                    "failures_covered": stats.failures_covered,
                    "merged": stats.merged,
                    "trajectories": len(views),
                    "references": len(references),
                    "skipped_malformed": skipped,
                },
            )
            session.add(row)
            await session.flush()
            if stats.kept:
                kept.append(row.id)
        return kept

    async def _trajectories(
        self, session: AsyncSession, request_id: uuid.UUID
    ) -> tuple[list[TrajectoryView], int]:
        """The request's train-split trajectories; malformed ones and those the environment
        broke (stored ungraded) are counted and left out."""
        rows = await session.execute(
            select(
                Trajectory.id,
                Task.external_id,
                Task.kind,
                Task.split,
                Trajectory.success,
                Trajectory.reward,
                Trajectory.messages,
                Trajectory.reward_breakdown,
            )
            .join(Task, Task.id == Trajectory.task_id)
            .where(Trajectory.request_id == request_id)
            .order_by(Task.external_id, Trajectory.trial)
        )
        views: list[TrajectoryView] = []
        skipped = 0
        for tid, task, kind, split, success, reward, messages, breakdown in rows:
            if reward is None:
                # the environment broke this episode: it says nothing about the agent
                log.warning("ungraded trajectory left out of a diagnosis", trajectory=str(tid))
                skipped += 1
                continue
            if split != "train":
                # Diagnosis must never see test tasks: they are held out for evaluation.
                log.warning("test-split trajectory left out of a diagnosis", trajectory=str(tid))
                skipped += 1
                continue
            try:
                views.append(
                    TrajectoryView.from_stored(
                        id=tid,
                        task_id=task,
                        task_kind=kind,
                        success=success,
                        reward=reward,
                        messages=messages,
                        reward_breakdown=breakdown,
                    )
                )
            except MalformedTrajectoryError as exc:
                log.warning("malformed trajectory left out of a diagnosis", error=str(exc))
                skipped += 1
        return views, skipped


async def _capability_limit(session: AsyncSession, cycle_id: uuid.UUID | None) -> int | None:
    """The cycle's `max_capabilities`: how many kept capabilities (best first) go on to
    synthesis and training; the rest stay stored as identified."""
    if cycle_id is None:
        return None
    cycle = await session.get(Cycle, cycle_id)
    if cycle is None:
        return None
    return cycle.settings.max_capabilities


def _rule_based(name: str) -> bool:
    return any(c.name == name for c in CATALOGUE)
