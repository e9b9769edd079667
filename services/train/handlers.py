"""Handlers of the train service: one job (`train.requested`) = one LoRA adapter.

A job's `config`: `agent_id` (when it has no capability), `rollout_budget` (default: the
service's), `budget_multiplier` (a baseline that must spend several adapters' budgets),
`max_steps`, and `grpo` (overrides of the GRPO settings, e.g. `{"group_size": 8}`); the
service adds `claim` and `progress` while it trains.

A job row is claimed (status `running`, attempt counted, worker named) in its own
transaction, so `retrace status` shows it at once; training runs in a thread, checkpointing
under the artifact store, and a job whose message comes back (a crash, a SIGTERM, a lost
worker) resumes from its checkpoint on whichever worker takes it. When the budget is spent
the adapter is written to a new versioned path, registered with its training curve, loaded
into the inference endpoint, and announced with `adapter.trained`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from services.train.config import TrainConfig
from services.train.gepa import GEPA, GEPASettings, SearchCheckpoint, UnreadableCheckpointError
from services.train.grpo import GRPOSettings, Policy, lora_policy
from services.train.heldout import HeldoutSettings, heldout
from services.train.sampling import EndpointSampler, Sampler
from services.train.trainer import Budget, Checkpoints, Progress, train
from shared.bus.delivery import Handler, HandlerContext, long_running
from shared.envs.loading import load_environment, row_ref
from shared.envs.protocol import Environment as EnvProtocol
from shared.errors import Cancelled, ConfigError, PermanentError, RetryableError
from shared.llm.client import LLMClient, LLMError
from shared.logging import get_logger
from shared.messages import (
    AdapterTrained,
    Contract,
    PromptOptimized,
    Sampling,
    TrainingFailed,
    TrainRequested,
)
from shared.progress import Tracker
from shared.serving.model_files import resolve_model
from shared.store.models import Adapter, Agent, Capability, Environment, TrainingJob
from shared.store.tenants import adapter_name

log = get_logger(__name__)


class TrainStopped(RetryableError):
    """The worker is stopping; the job goes back to the queue and resumes from its checkpoint."""


class LeaseLostError(RetryableError):
    """The job's claim could not be renewed: another worker may take it, so this one stops."""


class TrainHandlers:
    def __init__(self, cfg: TrainConfig, client: LLMClient | None = None) -> None:
        self.cfg = cfg
        self.client = client
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def table(self) -> dict[type[Contract], Handler]:
        return {TrainRequested: self.train_requested}

    def settings(self, overrides: dict[str, Any]) -> GRPOSettings:
        c = self.cfg
        base = {
            "rank": c.rank,
            "alpha": c.alpha,
            "learning_rate": c.learning_rate,
            "group_size": c.group_size,
            "groups_per_step": c.groups_per_step,
            "max_new_tokens": c.max_new_tokens,
            "max_turns": c.max_turns,
            "temperature": c.temperature,
            "seed": c.seed,
            "hint_share": c.hint_share or 0.0,
            "hint_correction": c.hint_correction,
            "tis_cap": GRPOSettings.tis_cap,
            "format_bonus": c.format_bonus,
            "sample_ahead": c.sample_ahead,
        }
        if not isinstance(overrides, dict):
            raise PermanentError(f"job config `grpo` must be an object, not {overrides!r}")
        unknown = set(overrides) - set(base)
        if unknown:
            raise PermanentError(f"job config `grpo` has unknown settings {sorted(unknown)}")
        try:
            return GRPOSettings(**{**base, **overrides})
        except (TypeError, ValueError) as exc:
            raise PermanentError(f"job config is invalid: {exc}") from exc

    @long_running
    async def train_requested(self, msg: TrainRequested, ctx: HandlerContext) -> None:
        # Read and validate in one short transaction; train outside any; record the result
        # (adapter, job row, outgoing message) in `ctx.record()`.
        async with ctx.store.tenant(ctx.tenant) as session:
            job = await session.get(TrainingJob, msg.job_id)
            if job is None:
                raise PermanentError(f"training job {msg.job_id} does not exist")
            if job.status in ("done", "failed", "cancelled"):
                log.info("training job already finished", job=str(job.id), status=job.status)
                return
            try:
                env_row, agent, capability, settings, budget = await self._validate(session, job)
                # a synthetic environment, or a target (the "GRPO on the target" baseline)
                env = await load_environment(session, row_ref(env_row))
            except PermanentError as exc:
                failure: str | None = str(exc)
            else:
                failure = None
        if failure is not None:
            await self._failed(ctx, job.id, job.cycle_id, failure)
            return
        checkpoint = self._root(ctx.tenant) / "checkpoints" / str(job.id)
        token = uuid.uuid4().hex
        claim = await self._claim(ctx, job.id, checkpoint, token)
        if claim != "claimed":
            log.info("training job not taken", job=str(job.id), reason=claim)
            return
        stop = threading.Event()
        gepa = job.config.get("kind") == "gepa"
        tracker = Tracker(
            ctx.store,
            ctx.tenant,
            job.id,
            kind="prompt" if gepa else "training",
            total=budget.rollouts if gepa else budget.steps(settings),
            unit="episodes" if gepa else "steps",
            label=(
                f"{capability.name}" if capability else f"baseline {'gepa' if gepa else 'grpo'}"
            ),
            cycle_id=job.cycle_id,
        )
        lease = asyncio.create_task(self._renew(ctx, job.id, stop, token))
        try:
            async with tracker:
                done = (
                    SearchCheckpoint(checkpoint).spent()
                    if gepa
                    else int((job.config.get("progress") or {}).get("step", 0))
                )
                try:
                    await tracker.start(done)
                except Cancelled as exc:
                    await self._cancelled(ctx, job.id, job.cycle_id, str(exc), token, tracker)
                    return
                if gepa:
                    work = self._optimise_prompt(
                        ctx, job, env, agent, budget.rollouts, checkpoint, token, tracker
                    )
                else:
                    work = self._grpo(
                        ctx,
                        job,
                        env_row,
                        env,
                        agent,
                        capability,
                        settings,
                        budget,
                        checkpoint,
                        stop,
                        token,
                        tracker,
                    )
                if not await self._guarded(work, lease, tracker):
                    await self._cancelled(
                        ctx, job.id, job.cycle_id, "cancelled (retrace cancel)", token, tracker
                    )
        finally:
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)

    async def _guarded(
        self, work: Coroutine[Any, Any, None], lease: asyncio.Task[None], tracker: Tracker
    ) -> bool:
        """Run `work` while the lease holds and nobody cancels the job; False when it was
        cancelled (the work stopped where it was, its last step checkpointed). A lease that
        could not be renewed (the store unreachable for a whole lease) ends `lease` with
        `LeaseLostError`: the work is stopped and the job handed back, before another worker
        may take it over."""
        task = asyncio.ensure_future(work)
        watch = asyncio.create_task(tracker.watch(self.cfg.cancel_poll_s))
        try:
            await asyncio.wait([task, lease, watch], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            if not watch.done():
                watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if not task.done():
            task.cancel()  # the lease was lost, or the job cancelled
            await asyncio.gather(task, return_exceptions=True)
            if lease.done():
                lease.result()  # raises LeaseLostError
            return False
        await task
        return True

    async def _cancelled(
        self,
        ctx: HandlerContext,
        job_id: uuid.UUID,
        cycle_id: uuid.UUID | None,
        why: str,
        token: str,
        tracker: Tracker,
    ) -> None:
        """The job was cancelled: it ends failed, saying so, and its cycle (if it still runs)
        goes on without it."""
        await self._failed(ctx, job_id, cycle_id, why, token, status="cancelled")
        await tracker.finish("cancelled")

    async def _grpo(
        self,
        ctx: HandlerContext,
        job: TrainingJob,
        env_row: Environment,
        env: EnvProtocol,
        agent: Agent,
        capability: Capability | None,
        settings: GRPOSettings,
        budget: Budget,
        checkpoint: Path,
        stop: threading.Event,
        token: str,
        tracker: Tracker,
    ) -> None:
        loop = asyncio.get_running_loop()
        writes: list[concurrent.futures.Future[None]] = []

        def on_step(progress: Progress, _: object) -> None:
            last = progress.curve[-1]
            log.info("train step", job=str(job.id), **last)
            writes.append(
                asyncio.run_coroutine_threadsafe(
                    self._progress(ctx, job.id, progress, tracker), loop
                )
            )

        try:
            sampler = self._sampler(ctx.tenant, job.id, loop)
        except ConfigError as exc:
            await self._failed(ctx, job.id, job.cycle_id, f"training could not run: {exc}", token)
            return
        work = asyncio.ensure_future(
            asyncio.to_thread(
                self._train,
                agent.model,
                env,
                agent.system_prompt,
                settings,
                budget,
                Checkpoints(checkpoint),
                on_step,
                stop,
                sampler,
            )
        )
        try:
            progress, policy, checked = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()  # the thread ends after its current step, checkpointed; wait for it
            await asyncio.wait([work])  # here, while the endpoint client still works
            if not work.cancelled():
                work.exception()  # retrieved: the job is handed back either way
            raise
        except (ConfigError, PermanentError, ValueError) as exc:
            # a model that cannot load, an environment without train tasks: no retry helps
            await self._failed(ctx, job.id, job.cycle_id, f"training could not run: {exc}", token)
            return
        finally:
            # a late progress write must not land over the result
            await asyncio.gather(*(asyncio.wrap_future(w) for w in writes), return_exceptions=True)
            _report_progress_errors(job.id, writes)
        if progress.step < budget.steps(settings):
            raise TrainStopped(f"job {job.id} stopped at step {progress.step}")
        await self._register(
            ctx, job, agent, capability, env_row, settings, progress, policy, checked, token
        )

    async def _validate(
        self, session: AsyncSession, job: TrainingJob
    ) -> tuple[Environment, Agent, Capability | None, GRPOSettings, Budget]:
        env_row = await session.get(Environment, job.environment_id)
        capability = await session.get(Capability, job.capability_id) if job.capability_id else None
        if env_row is None or env_row.status != "ready":
            raise PermanentError(f"job {job.id}: its environment is missing or not ready")
        agent_id = capability.agent_id if capability else job.config.get("agent_id")
        agent = await session.get(Agent, uuid.UUID(str(agent_id))) if agent_id else None
        if agent is None:
            raise PermanentError(f"job {job.id}: no agent (capability or config.agent_id)")
        overrides = job.config.get("grpo", {})
        if self.cfg.hint_share is None and isinstance(overrides, dict):
            # the share the environment was calibrated with, unless the job sets its own
            overrides = {"hint_share": _calibrated_share(env_row.spec), **overrides}
        settings = self.settings(overrides)
        multiplier = job.config.get("budget_multiplier", 1)
        if not isinstance(multiplier, int) or multiplier < 1:
            raise PermanentError(f"job {job.id}: budget_multiplier must be a positive integer")
        budget = Budget(
            rollouts=int(job.config.get("rollout_budget", self.cfg.rollout_budget)) * multiplier,
            max_steps=job.config.get("max_steps", self.cfg.max_steps),
        )
        if job.config.get("kind") not in (None, "grpo", "gepa"):
            raise PermanentError(f"job {job.id}: unknown kind {job.config['kind']!r}")
        if job.config.get("kind") != "gepa" and budget.steps(settings) < 1:
            raise PermanentError(
                f"job {job.id}: a budget of {budget.rollouts} rollouts buys no step of "
                f"{settings.group_size * settings.groups_per_step}"
            )
        return env_row, agent, capability, settings, budget

    async def _optimise_prompt(
        self,
        ctx: HandlerContext,
        job: TrainingJob,
        env: EnvProtocol,
        agent: Agent,
        budget: int,
        checkpoint: Path,
        token: str,
        tracker: Tracker,
    ) -> None:
        """The GEPA baseline: optimise the agent's system prompt within the rollout budget
        (through the inference endpoint, like rollouts); the prompt goes into the job. The
        search is checkpointed after every iteration and resumes from there."""
        if self.client is None:
            await self._failed(
                ctx, job.id, job.cycle_id, "prompt optimisation needs the endpoint", token
            )
            return
        tasks = [t for t in env.tasks() if t.split == "train"]
        try:
            settings = GEPASettings(
                budget=budget,
                agent_model=agent.model,
                reflection_model=self.cfg.reflection_model or agent.model,
                max_turns=self.cfg.max_turns,
                sampling=Sampling(
                    temperature=self.cfg.temperature, max_tokens=self.cfg.max_new_tokens
                ),
                seed=self.cfg.seed,
            )
        except ValueError as exc:
            await self._failed(
                ctx, job.id, job.cycle_id, f"prompt optimisation cannot run: {exc}", token
            )
            return
        started = time.perf_counter()
        try:
            result = await GEPA(self.client, env, settings, on_spent=tracker.advance).optimise(
                tasks, agent.system_prompt, SearchCheckpoint(checkpoint)
            )
        except UnreadableCheckpointError as exc:  # starting over would pay twice
            await self._failed(
                ctx, job.id, job.cycle_id, f"prompt optimisation cannot resume: {exc}", token
            )
            return
        async with ctx.record() as session:
            await self._finish_prompt(session, job.id, token, result, time.perf_counter() - started)
            ctx.emit(PromptOptimized(job_id=job.id, cycle_id=job.cycle_id))
        log.info(
            "prompt optimised",
            job=str(job.id),
            score=round(result.score, 3),
            seed=round(result.seed_score, 3),
            rollouts=result.rollouts,
        )

    async def _finish_prompt(
        self, session: AsyncSession, job_id: uuid.UUID, token: str, result: Any, wall_s: float
    ) -> None:
        job = await _job(session, job_id, token)
        job.status = "done"
        job.config = {
            **job.config,
            "result": {
                "prompt": result.prompt,
                "score": result.score,
                "seed_score": result.seed_score,
                "candidates": len(result.candidates),
                "iterations": result.iterations,
                "accepted": result.accepted,
            },
            "progress": {"rollouts": result.rollouts, "resumes": result.resumes},
            "wall_s": round(wall_s, 3),
        }

    async def _failed(
        self,
        ctx: HandlerContext,
        job_id: uuid.UUID,
        cycle_id: uuid.UUID | None,
        why: str,
        token: str | None = None,
        status: str = "failed",
    ) -> None:
        async with ctx.record() as session:
            job = await _job(session, job_id, token)
            job.status = status
            job.error = why
            ctx.emit(TrainingFailed(job_id=job_id, reason=why, cycle_id=cycle_id))
        log.error("training job failed", job=str(job_id), reason=why)

    def _train(
        self,
        model: str,
        env: EnvProtocol,
        system_prompt: str,
        settings: GRPOSettings,
        budget: Budget,
        checkpoints: Checkpoints,
        on_step: Any,
        stop: threading.Event,
        sampler: Callable[[Policy], Sampler] | None,
    ) -> tuple[Progress, Any, dict[str, Any]]:
        """The run's progress, the policy, and the held-out check once the budget is spent."""
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        policy = lora_policy(str(resolve_model(model)), settings, device=self._device())
        chosen = sampler(policy) if sampler is not None else None
        try:
            progress = train(
                policy,
                env,
                settings,
                budget,
                checkpoints,
                system_prompt=system_prompt,
                on_step=on_step,
                should_stop=stop.is_set,
                sampler=chosen,
            )
        finally:
            if chosen is not None:
                chosen.close()
        checked: dict[str, Any] = {}
        if progress.step >= budget.steps(settings) and self.cfg.heldout_tasks:
            h = HeldoutSettings(
                tasks=self.cfg.heldout_tasks,
                samples=self.cfg.heldout_samples,
                batch=self.cfg.heldout_batch,
                seed=settings.seed,
            )
            checked = heldout(policy, env, settings, h, system_prompt=system_prompt)
            log.info("held-out check", **{k: v for k, v in checked.items() if k != "ci95"})
        return progress, policy, checked

    def _device(self) -> str:
        import torch

        if self.cfg.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("RETRACE_TRAIN_DEVICE=cuda, but torch sees no GPU")
        return self.cfg.device

    def _sampler(
        self, tenant: str, job_id: uuid.UUID, loop: asyncio.AbstractEventLoop
    ) -> Callable[[Policy], Sampler] | None:
        """How the job's rollouts are sampled: None for the policy itself (in process)."""
        if self.cfg.generation == "local":
            return None
        client = self.client
        if client is None:
            raise ConfigError("RETRACE_TRAIN_GENERATION=endpoint needs the inference endpoint")
        directory = self._root(tenant) / "live" / str(job_id)
        return lambda policy: EndpointSampler(
            client, loop, directory, f"{tenant}/train-{job_id}", policy.end_id
        )

    def _root(self, tenant: str) -> Path:
        return self.cfg.storage.artifact_path / tenant

    async def _claim(
        self, ctx: HandlerContext, job_id: uuid.UUID, checkpoint: Path, token: str
    ) -> str:
        """`claimed`, or why not: `finished`, or `owned` (another delivery holds a live claim).

        A redelivery of the claiming message itself takes over: JetStream only sends it again
        once its holder stopped heartbeating (a crash, a lost worker; or a holder cut off from
        NATS that still works, which finds its `token` replaced at its next renewal and
        stops, and can no longer record a result)."""
        async with ctx.store.tenant(ctx.tenant) as session:
            job = await session.get(TrainingJob, job_id, with_for_update=True)
            if job is None or job.status in ("done", "failed", "cancelled"):
                return "finished"
            holder = job.config.get("claim", {})
            age = (datetime.now(UTC) - job.updated_at).total_seconds()
            live = job.status == "running" and age < self.cfg.lease_s
            if live and holder.get("msg_id") != ctx.msg_id:
                return "owned"
            job.status = "running"
            job.attempts += 1
            job.worker = self.worker
            job.checkpoint_uri = str(checkpoint)
            job.config = {
                **job.config,
                "claim": {"msg_id": ctx.msg_id, "worker": self.worker, "token": token},
            }
        return "claimed"

    async def _renew(
        self, ctx: HandlerContext, job_id: uuid.UUID, stop: threading.Event, token: str
    ) -> None:
        """Keep the claim alive (`updated_at`) while this worker trains. A renewal that fails
        is tried again; once none has succeeded for most of a lease, the lease is lost:
        training is told to stop and `LeaseLostError` ends this task, before the claim
        expires and another worker may take the job."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.cfg.lease_s / 6)
            try:
                async with asyncio.timeout(self.cfg.lease_s / 6):
                    async with ctx.store.tenant(ctx.tenant) as session:
                        renewal = await session.execute(
                            update(TrainingJob)
                            .where(
                                TrainingJob.id == job_id,
                                TrainingJob.config["claim"]["token"].astext == token,
                            )
                            .values(updated_at=func.now())
                        )
                if renewal.rowcount == 0:  # type: ignore[attr-defined]
                    stop.set()
                    raise LeaseLostError(f"job {job_id}: another delivery took the job over")
                renewed = time.monotonic()
            except (SQLAlchemyError, OSError, TimeoutError) as exc:
                held = time.monotonic() - renewed
                log.warning(
                    "lease renewal failed", job=str(job_id), error=repr(exc), since_s=round(held)
                )
                if held >= self.cfg.lease_s * 2 / 3:
                    stop.set()
                    raise LeaseLostError(
                        f"job {job_id}: the lease could not be renewed for {held:.0f} s"
                    ) from exc

    async def _progress(
        self, ctx: HandlerContext, job_id: uuid.UUID, p: Progress, tracker: Tracker
    ) -> None:
        """The job's progress, for `retrace status` (the checkpoint is the real record)."""
        with contextlib.suppress(Cancelled):  # the cancel watch stops the job
            await tracker.set(p.step)
        async with ctx.store.tenant(ctx.tenant) as session:
            # locked: an unlocked read-modify-write of `config` could put back a claim that
            # another delivery replaced meanwhile
            job = await session.get(TrainingJob, job_id, with_for_update=True)
            if job is not None:
                last = p.curve[-1] if p.curve else {}
                job.config = {
                    **job.config,
                    "progress": {
                        "step": p.step,
                        "rollouts": p.rollouts,
                        "mean_reward": last.get("mean_reward"),
                    },
                }

    async def _register(
        self,
        ctx: HandlerContext,
        job: TrainingJob,
        agent: Agent,
        capability: Capability | None,
        env_row: Environment,
        settings: GRPOSettings,
        progress: Progress,
        policy: Any,
        checked: dict[str, Any],
        token: str,
    ) -> None:
        skill = capability.name if capability else env_row.name.split("/")[-1]
        async with ctx.store.tenant(ctx.tenant) as session:
            version = 1 + (
                await session.scalar(
                    select(func.count())
                    .select_from(Adapter)
                    .where(Adapter.agent_id == agent.id, Adapter.capability_id == job.capability_id)
                )
                or 0
            )
        # one inference endpoint serves every tenant: the name starts with the tenant, so no
        # two tenants' adapters ever share one; the job's id keeps it unique if two jobs of
        # one capability count alike
        name = adapter_name(ctx.tenant, agent.name, skill, version, job.id)
        # this delivery's own directory: one taken over meanwhile cannot overwrite the weights
        # the other registers
        folder = f"v{version}-{job.id}-{token[:8]}"
        path = self._root(ctx.tenant) / "adapters" / agent.name / skill / folder
        await asyncio.to_thread(policy.model.save_pretrained, path)
        status = "trained"
        if self.client is not None and self.cfg.load_into_endpoint:
            try:
                await self.client.load_adapter(name, str(path))
                status = "loaded"
            except (LLMError, PermanentError, OSError) as exc:
                log.warning("adapter not loaded into the endpoint", adapter=name, error=str(exc))
        adapter = Adapter(
            agent_id=agent.id,
            capability_id=job.capability_id,
            cycle_id=job.cycle_id,
            name=name,
            artifact_uri=str(path),
            base_model=agent.model,
            lora_config={
                "r": settings.rank,
                "alpha": settings.alpha,
                "target_modules": list(settings.target_modules),
                "learning_rate": settings.learning_rate,
                "group_size": settings.group_size,
            },
            training_curve=progress.curve,
            status=status,
            heldout=checked,
        )
        async with ctx.record() as session:
            session.add(adapter)
            await session.flush()
            row = await _job(session, job.id, token)
            row.status = "done"
            row.adapter_id = adapter.id
            row.config = {
                **row.config,
                "progress": {"step": progress.step, "rollouts": progress.rollouts},
                "wall_s": round(progress.wall_s, 3),
                "resumed_from": progress.resumes,
            }
            ctx.emit(AdapterTrained(adapter_id=adapter.id, job_id=job.id, cycle_id=job.cycle_id))
        log.info("adapter trained", adapter=name, steps=progress.step, rollouts=progress.rollouts)


async def _job(session: AsyncSession, job_id: uuid.UUID, token: str | None) -> TrainingJob:
    """The job's row, locked for the write that finishes it; with `token`, only while this
    delivery's claim holds (one that was taken over must not record its result)."""
    job = await session.get(TrainingJob, job_id, with_for_update=True)
    if job is None:
        raise PermanentError(f"training job {job_id} disappeared while it ran")
    if token is not None and (job.config.get("claim") or {}).get("token") != token:
        raise LeaseLostError(f"job {job_id}: another delivery took the job over")
    return job


def _report_progress_errors(
    job_id: uuid.UUID, writes: list[concurrent.futures.Future[None]]
) -> None:
    """Progress rows are advisory, but a write that failed is said, not dropped."""
    for write in writes:
        if write.done() and not write.cancelled() and write.exception() is not None:
            log.warning("progress not written", job=str(job_id), error=repr(write.exception()))


def _calibrated_share(spec: dict[str, Any]) -> float:
    share = spec.get("hint_share", 0.0) if isinstance(spec, dict) else 0.0
    return float(share) if isinstance(share, int | float) and 0 <= share <= 1 else 0.0
