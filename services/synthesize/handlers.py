"""Handlers of the synthesize service: one calibrated training environment per capability.

capabilities.identified -> a spec per capability, validated and checked for determinism,
stored as a `calibrating` environment, and a calibration rollout requested. rollout.completed
(purpose calibrate) -> the rewards judged: accepted (`ready`, environment.ready), or the spec
adjusted and recalibrated as a new version, up to `max_regenerations`, then `failed` with the
numbers. Every step is one transaction; the state lives in the environments table.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.synthesize.config import SynthesizeConfig
from services.synthesize.writer import SpecWriter, SpecWriterError, WriterConfig
from shared.bus.delivery import Handler, HandlerContext, long_running
from shared.envs.derived.build import adjust_derived, derived_spec
from shared.envs.derived.env import DerivedEnvironment
from shared.envs.derived.simulated import is_remote, simulate
from shared.envs.derived.spec import DerivedSpec, decode_derived, is_derived
from shared.envs.guidance import hinted_trials
from shared.envs.loading import synthetic_ref
from shared.envs.registry import BUILTIN, open_environment
from shared.envs.synthetic import (
    CalibrationConfig,
    SyntheticEnvironment,
    SyntheticSpec,
    adjust,
    calibrate,
    check_deterministic,
    default_spec,
    toolbox_schemas,
    validate,
)
from shared.envs.synthetic.spec import decode
from shared.envs.synthetic.tasks import GeneratorError
from shared.errors import PermanentError
from shared.llm.client import LLMClient
from shared.logging import get_logger
from shared.messages import (
    CapabilitiesIdentified,
    Contract,
    EnvironmentReady,
    RolloutCompleted,
    RolloutRequested,
    Sampling,
    SynthesisFailed,
)
from shared.store.models import Agent, Capability, Environment, Task, Trajectory

log = get_logger(__name__)


EVIDENCE_EXAMPLES = 3
EVIDENCE_CHARS = 240


class SynthesizeHandlers:
    def __init__(self, cfg: SynthesizeConfig, client: LLMClient | None = None) -> None:
        self.cfg = cfg
        self.writer: SpecWriter | None = None
        if cfg.writer_model and client is not None:
            self.writer = SpecWriter(
                client,
                WriterConfig(
                    model=cfg.writer_model,
                    max_attempts=cfg.writer_attempts,
                    determinism_seeds=cfg.determinism_seeds,
                ),
            )
        self.calibration = CalibrationConfig(
            seeds=cfg.calibration_tasks,
            samples=cfg.calibration_samples,
            max_hint_share=cfg.max_hint_share,
            max_regenerations=cfg.max_regenerations,
        )

    def table(self) -> dict[type[Contract], Handler]:
        return {
            CapabilitiesIdentified: self.capabilities_identified,
            RolloutCompleted: self.rollout_completed,
        }

    @long_running
    async def capabilities_identified(
        self, msg: CapabilitiesIdentified, ctx: HandlerContext
    ) -> None:
        # Read in a short transaction, let the writer model work outside any, then store the
        # environments and ask for their calibration in the one that records the message.
        todo: list[tuple[uuid.UUID, str, str, list[str]]] = []
        derived: dict[uuid.UUID, DerivedSpec] = {}
        async with ctx.store.tenant(ctx.tenant) as session:
            agent = await session.get(Agent, msg.agent_id)
            target = agent.environment if agent is not None else "toolbox"
            for capability_id in msg.capability_ids:
                capability = await session.get(Capability, capability_id)
                if capability is None:
                    log.warning("capability not found; skipped", capability=str(capability_id))
                    continue
                if _taken(capability, await _versions(session, capability)):
                    continue
                if target not in BUILTIN:
                    # a plug-in target: the capability is isolated by replaying its own tasks
                    derived[capability.id] = derived_spec(
                        target,
                        capability.name,
                        capability.definition,
                        await _failed_tasks(session, capability),
                        await _train_tasks(target),
                    )
                excerpts = (
                    await self._failure_excerpts(session, capability)
                    if self.writer and capability.id not in derived
                    else []
                )
                todo.append((capability.id, capability.name, capability.definition, excerpts))
        for capability_id, planned in list(derived.items()):
            derived[capability_id] = await _replayable(planned)
        written: list[tuple[uuid.UUID, tuple[SyntheticSpec | DerivedSpec, dict[str, str]]]] = [
            (cid, (derived[cid], {}) if cid in derived else await self._spec(name, definition, ex))
            for cid, name, definition, ex in todo
        ]
        async with ctx.record() as session:
            for capability_id, (spec, writer) in written:
                capability = await session.get(Capability, capability_id, with_for_update=True)
                if capability is None:
                    continue
                versions = await _versions(session, capability)
                if _taken(capability, versions):
                    continue  # another delivery got there first
                if writer:
                    capability.evidence = {**capability.evidence, "writer": writer}
                # A capability whose earlier environments all failed starts again after them.
                spec = msgspec.structs.replace(
                    spec,
                    revision=max(versions, default=0),
                    hint_share=min(self.cfg.hint_share, self.cfg.max_hint_share),
                )
                await self._calibrate(
                    ctx, session, capability, msg.agent_id, msg.cycle_id, spec, attempt=0
                )

    async def _spec(
        self, name: str, definition: str, excerpts: list[str]
    ) -> tuple[SyntheticSpec, dict[str, str]]:
        """The writer's spec when one is configured and it writes a valid one; else the
        default spec; with what to keep of the writer in the capability's evidence."""
        if self.writer is None:
            return default_spec(name, definition), {}
        try:
            spec = await self.writer.write(name, definition, excerpts)
        except SpecWriterError as exc:
            log.warning("written spec rejected; default spec used", capability=name)
            return default_spec(name, definition), {"rejected": str(exc)}
        return spec, {"accepted": spec.name}

    async def _failure_excerpts(self, session: AsyncSession, capability: Capability) -> list[str]:
        """Request and last reply of a few failed trajectories the capability was found in."""
        ids = []
        for raw in capability.evidence.get("failed_examples", [])[:EVIDENCE_EXAMPLES]:
            try:
                ids.append(uuid.UUID(str(raw)))
            except ValueError:
                continue
        if not ids:
            return []
        excerpts = []
        for messages in await session.scalars(
            select(Trajectory.messages).where(Trajectory.id.in_(ids))
        ):
            asked = next((m.get("content") for m in messages if m.get("role") == "user"), "")
            said = next(
                (
                    m.get("content")
                    for m in reversed(messages)
                    if m.get("role") == "assistant" and m.get("content")
                ),
                "",
            )
            text = f"user asked: {asked!s} / assistant ended with: {said!s}"
            excerpts.append(text[:EVIDENCE_CHARS])
        return excerpts

    async def rollout_completed(self, msg: RolloutCompleted, ctx: HandlerContext) -> None:
        if msg.purpose != "calibrate":
            return
        row = await ctx.session.scalar(
            select(Environment).where(
                Environment.calibration["request_id"].astext == str(msg.request_id)
            )
        )
        if row is None:
            log.warning("calibration rollout of no known environment", request=str(msg.request_id))
            return
        capability = (
            await ctx.session.get(Capability, row.capability_id) if row.capability_id else None
        )
        groups: dict[uuid.UUID, list[float]] = defaultdict(list)
        hinted: dict[uuid.UUID, list[float]] = defaultdict(list)
        hinted_trial = hinted_trials(
            int(row.calibration.get("samples", self.cfg.calibration_samples)),
            float(row.calibration.get("hint_share", 0.0)),
        )
        for task_id, trial, reward in await ctx.session.execute(
            select(Trajectory.task_id, Trajectory.trial, Trajectory.reward).where(
                Trajectory.request_id == msg.request_id,
                Trajectory.reward.is_not(None),  # episodes the environment broke are ungraded
            )
        ):
            if task_id is not None:  # hinted trials first in each group, as calibrate reads
                (hinted if trial in hinted_trial else groups)[task_id].append(float(reward or 0))
        result = calibrate(
            {task: hinted[task] + groups[task] for task in hinted.keys() | groups.keys()},
            self.calibration,
            hinted=len(hinted_trial),
        )
        attempt = int(row.calibration.get("attempt", 0))
        row.calibration = {**row.calibration, "result": msgspec.to_builtins(result)}
        log.info(
            "calibration judged",
            environment=row.name,
            version=row.version,
            accepted=result.accepted,
            mean=round(result.mean_reward, 3),
            success=round(result.success_rate, 3),
            informative=round(result.informative, 3),
            hinted_mean=result.hinted_mean,
            unhinted_mean=result.unhinted_mean,
        )
        if result.accepted:
            row.status = "ready"
            if capability is not None:
                capability.status = "synthesized"
            ctx.emit(
                EnvironmentReady(
                    environment_id=row.id,
                    capability_id=row.capability_id or row.id,
                    cycle_id=msg.cycle_id,
                )
            )
            return
        row.status = "rejected"
        adjusted: SyntheticSpec | DerivedSpec | None = None
        if capability is not None and attempt < self.cfg.max_regenerations:
            adjusted = (
                adjust_derived(
                    decode_derived(msgspec.json.encode(row.spec)),
                    too_hard=result.direction == "easier",
                    max_hint_share=self.cfg.max_hint_share,
                )
                if is_derived(row.spec)
                else adjust(decode(msgspec.json.encode(row.spec)), result, self.calibration)
            )
        if adjusted is None:  # out of attempts, or nothing left to adjust
            row.status = "failed"
            if capability is not None:
                _give_up(
                    ctx,
                    capability,
                    msg.cycle_id,
                    {
                        "reason": (
                            f"{capability.name}: calibration failed after {attempt + 1} "
                            f"attempt(s), the last: {'; '.join(result.reasons) or 'rejected'}"
                        ),
                        "attempts": attempt + 1,
                        "last": msgspec.to_builtins(result),
                    },
                )
            return
        assert capability is not None
        await self._calibrate(
            ctx, ctx.session, capability, msg.agent_id, msg.cycle_id, adjusted, attempt + 1
        )

    async def _calibrate(
        self,
        ctx: HandlerContext,
        session: AsyncSession,
        capability: Capability,
        agent_id: uuid.UUID,
        cycle_id: uuid.UUID | None,
        spec: SyntheticSpec | DerivedSpec,
        attempt: int,
    ) -> None:
        """Store the spec as a new environment version and ask for its calibration rollout."""
        env: SyntheticEnvironment | DerivedEnvironment
        if isinstance(spec, DerivedSpec):
            try:
                target = None if spec.simulated is not None else await open_environment(spec.target)
                env = DerivedEnvironment(spec, target)
            except PermanentError as exc:  # the spec, or a target that no longer loads
                _give_up(
                    ctx, capability, cycle_id, {"reason": "invalid spec", "problems": [str(exc)]}
                )
                log.error("derived spec rejected", capability=capability.name, error=str(exc))
                return
        else:
            problems = validate(spec, toolbox_schemas()) or check_deterministic(
                spec, range(self.cfg.determinism_seeds)
            )
            if problems:
                _give_up(
                    ctx, capability, cycle_id, {"reason": "invalid spec", "problems": problems}
                )
                log.error("generated spec rejected", capability=capability.name, problems=problems)
                return
            env = SyntheticEnvironment(spec)
        try:
            all_tasks = env.tasks()
        except GeneratorError as exc:
            _give_up(
                ctx, capability, cycle_id, {"reason": "generator failed", "problems": [str(exc)]}
            )
            log.error("generator failed", capability=capability.name, error=str(exc))
            return
        tasks = sorted((t for t in all_tasks if t.split == "train"), key=lambda t: t.id)
        tasks = tasks[: self.cfg.calibration_tasks]
        request_id = uuid.uuid4()
        seed = self.cfg.seed + attempt  # the rollouts' sampling seed: a verdict reproducible
        # Versions count per name across capabilities, cycles and agents of the tenant: the
        # same capability found again gets a new version, never a clash.
        latest = await session.scalar(
            select(func.max(Environment.version)).where(Environment.name == env.name)
        )
        row = Environment(
            name=env.name,
            version=(latest or 0) + 1,
            kind="synthetic",
            spec=msgspec.to_builtins(spec),
            status="calibrating",
            capability_id=capability.id,
            calibration={
                "attempt": attempt,
                "seed": seed,
                "request_id": str(request_id),
                "tasks": len(tasks),
                "samples": self.cfg.calibration_samples,
                "hint_share": spec.hint_share,
                "max_turns": self.cfg.max_turns,
            },
        )
        session.add(row)
        await session.flush()
        capability.status = "synthesizing"
        ctx.emit(
            RolloutRequested(
                request_id=request_id,
                agent_id=agent_id,
                environment=synthetic_ref(env.name, row.version),
                task_ids=[t.id for t in tasks],
                trials=self.cfg.calibration_samples,
                sampling=Sampling(
                    temperature=self.cfg.temperature,
                    max_tokens=self.cfg.max_tokens,
                    seed=seed,
                ),
                cycle_id=cycle_id,
                purpose="calibrate",
                hint_share=spec.hint_share,
                max_turns=self.cfg.max_turns,
            ),
            key=str(row.id),
        )


async def _replayable(spec: DerivedSpec) -> DerivedSpec:
    """`spec` as it can be replayed in training: as is for a target with a synchronous reset,
    else with each task's opening snapshotted and its tools simulated (an HTTP or MCP
    target; asked outside any transaction). A target that does not load, or a capability
    without a check, is left as is: `_calibrate` gives up on it with the reason."""
    try:
        target = await open_environment(spec.target)
        if not is_remote(target):
            return spec
        simulated = await simulate(spec, target)
    except PermanentError as exc:
        log.warning("no simulated replay of a remote target", target=spec.target, error=str(exc))
        return spec
    log.info(
        "remote target: its tasks are replayed from snapshots with simulated tool results",
        target=spec.target,
        environment=spec.name,
        tasks=len(spec.task_ids),
    )
    return simulated


async def _train_tasks(target: str) -> list[str]:
    """The target's train task ids; none when it does not load (synthesis then gives up on
    it with the reason, in `_calibrate`)."""
    try:
        env = await open_environment(target)
    except PermanentError as exc:
        log.warning("target environment does not load", target=target, error=str(exc))
        return []
    return [t.id for t in env.tasks() if t.split == "train"]


async def _failed_tasks(session: AsyncSession, capability: Capability) -> list[str]:
    """The tasks (external ids) of the failed trajectories the capability was found in."""
    ids = []
    for raw in capability.evidence.get("failed_examples", []):
        try:
            ids.append(uuid.UUID(str(raw)))
        except ValueError:
            continue
    if not ids:
        return []
    rows = await session.scalars(
        select(Task.external_id)
        .join(Trajectory, Trajectory.task_id == Task.id)
        .where(Trajectory.id.in_(ids))
    )
    return sorted(set(rows))


async def _versions(session: AsyncSession, capability: Capability) -> dict[int, str]:
    """The capability's environments: version -> status."""
    rows = await session.execute(
        select(Environment.version, Environment.status).where(
            Environment.capability_id == capability.id
        )
    )
    return {version: status for version, status in rows}


def _taken(capability: Capability, versions: dict[int, str]) -> bool:
    """Whether the capability has an environment being calibrated or ready (then skipped)."""
    if any(status in ("calibrating", "ready") for status in versions.values()):
        log.info("capability already has an environment; skipped", capability=capability.name)
        return True
    return False


def _give_up(
    ctx: HandlerContext,
    capability: Capability,
    cycle_id: uuid.UUID | None,
    synthesis: dict[str, object],
) -> None:
    """The capability gets no environment: say why in its evidence, and tell the cycle."""
    capability.status = "synth_failed"
    capability.evidence = {**capability.evidence, "synthesis": synthesis}
    ctx.emit(
        SynthesisFailed(
            capability_id=capability.id, reason=str(synthesis["reason"]), cycle_id=cycle_id
        ),
        key=f"failed-{capability.id}",
    )
