"""Handlers of the rollout service: one async function per consumed contract."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from services.rollout.config import RolloutConfig
from services.rollout.tasks import import_tasks, select_tasks
from shared.bus.delivery import Handler, HandlerContext, long_running
from shared.envs.guidance import hinted_trials
from shared.envs.loading import load_environment, parse_ref
from shared.envs.protocol import Environment, TaskSpec
from shared.envs.runner import EpisodeResult, run_episode
from shared.errors import Cancelled, PermanentError, RetryableError
from shared.llm.adapters import Served, artifact_of
from shared.llm.client import LLMClient
from shared.logging import get_logger
from shared.messages import Contract, RolloutCompleted, RolloutRequested, Sampling
from shared.progress import Tracker
from shared.store.models import Agent, Trajectory

log = get_logger(__name__)
MAX_TRIALS = 64


class RolloutHandlers:
    """Runs the episodes a RolloutRequested names; each trajectory commits on its own, so a
    restart resumes where the last instance stopped and never stores an episode twice."""

    def __init__(self, cfg: RolloutConfig, client: LLMClient) -> None:
        self.cfg = cfg
        self.client = client
        self.served = Served(client)

    def table(self) -> dict[type[Contract], Handler]:
        return {RolloutRequested: self.rollout_requested}

    @long_running
    async def rollout_requested(self, msg: RolloutRequested, ctx: HandlerContext) -> None:
        if not 1 <= msg.trials <= MAX_TRIALS:
            raise PermanentError(f"trials must be between 1 and {MAX_TRIALS}, got {msg.trials}")
        async with ctx.store.tenant(ctx.tenant) as session:
            agent = await session.get(Agent, msg.agent_id)
            if agent is None:
                raise PermanentError(f"no agent {msg.agent_id} for tenant {ctx.tenant}")
            env = await load_environment(session, msg.environment)
            model = msg.adapter or agent.model
            artifact = await artifact_of(session, model)
        tasks = select_tasks(env, msg.split, msg.task_ids)
        if not tasks:
            raise PermanentError(f"{msg.environment} has no tasks for split {msg.split!r}")
        env_id, task_rows = await import_tasks(
            ctx.store, ctx.tenant, env, parse_ref(msg.environment)[1]
        )
        done = await self._stored(ctx, msg.request_id)
        todo = [
            (t, trial)
            for t in tasks
            for trial in range(msg.trials)
            if (task_rows[t.id], trial) not in done
        ]
        log.info(
            "rollout started",
            request=str(msg.request_id),
            env=env.name,
            episodes=len(tasks) * msg.trials,
            already_stored=len(tasks) * msg.trials - len(todo),
        )
        total = len(tasks) * msg.trials
        async with Tracker(
            ctx.store,
            ctx.tenant,
            msg.request_id,
            kind="rollout",
            total=total,
            label=f"{msg.purpose} {msg.environment}" + (f" ({msg.adapter})" if msg.adapter else ""),
            cycle_id=msg.cycle_id,
        ) as work:
            await work.start(total - len(todo))
            await self._play(msg, ctx, agent, env, model, artifact, env_id, task_rows, todo, work)
        count, successes, mean, broken = await self._summary(ctx, msg.request_id)
        ctx.emit(
            RolloutCompleted(
                request_id=msg.request_id,
                agent_id=msg.agent_id,
                trajectories=count,
                successes=successes,
                mean_reward=mean,
                cycle_id=msg.cycle_id,
                purpose=msg.purpose,
                env_errors=broken,
            )
        )
        log.info(
            "rollout completed",
            request=str(msg.request_id),
            trajectories=count,
            successes=successes,
            env_errors=broken,
        )

    async def _play(
        self,
        msg: RolloutRequested,
        ctx: HandlerContext,
        agent: Agent,
        env: Environment,
        model: str,
        artifact: str | None,
        env_id: uuid.UUID,
        task_rows: dict[str, uuid.UUID],
        todo: list[tuple[TaskSpec, int]],
        work: Tracker,
    ) -> None:
        """Play and store the episodes in `todo`, counting each on `work`."""
        await self.served.wait_until_up(self.cfg.endpoint_wait_s, ctx.heartbeat)
        await self.served.ensure(model, artifact)
        gate = asyncio.Semaphore(self.cfg.episodes_at_once)
        hinted = hinted_trials(msg.trials, msg.hint_share)

        async def one(task: TaskSpec, trial: int) -> None:
            async with gate:
                result = await run_episode(
                    self.client,
                    model,
                    env,
                    task,
                    seed=_seed(task),
                    agent_prompt=(
                        msg.system_prompt if msg.system_prompt is not None else agent.system_prompt
                    ),
                    sampling=_sampling(msg.sampling, trial),
                    max_turns=min(self.cfg.max_turns, msg.max_turns or self.cfg.max_turns),
                    hinted=trial in hinted,
                )
            if result.model_error:
                # The endpoint failed, not the agent: storing a zero would bias every statistic
                # and the resume would never retry it. Fail the request; it is redelivered.
                raise RetryableError(f"{task.id} trial {trial}: {result.error}")
            await self._store(ctx, msg, agent.id, env_id, task_rows[task.id], trial, model, result)
            await work.advance()

        # A TaskGroup cancels the remaining episodes when one fails (or the work is cancelled),
        # so a retried request never races the leftovers of its previous delivery.
        try:
            async with asyncio.TaskGroup() as group:
                for t, trial in todo:
                    group.create_task(one(t, trial))
        except* Cancelled as cancelled:
            raise cancelled.exceptions[0] from None
        except* RetryableError as errors:
            raise errors.exceptions[0] from None

    async def _stored(
        self, ctx: HandlerContext, request_id: uuid.UUID
    ) -> set[tuple[uuid.UUID, int]]:
        async with ctx.store.tenant(ctx.tenant) as session:
            rows = await session.execute(
                select(Trajectory.task_id, Trajectory.trial).where(
                    Trajectory.request_id == request_id
                )
            )
            return {(task_id, trial) for task_id, trial in rows if task_id is not None}

    async def _store(
        self,
        ctx: HandlerContext,
        msg: RolloutRequested,
        agent_id: uuid.UUID,
        env_id: uuid.UUID,
        task_id: uuid.UUID,
        trial: int,
        model: str,
        result: EpisodeResult,
    ) -> None:
        breakdown = dict(result.score.breakdown)
        extra = {
            "notes": result.score.notes,
            "turns": result.turns,
            "error": result.error,
            "calls": result.calls,
            "opening": result.opening,
            "purpose": msg.purpose,
        }
        if result.env_error:
            extra["env_error"] = True
        async with ctx.store.tenant(ctx.tenant) as session:
            await session.execute(
                insert(Trajectory)
                .values(
                    id=uuid.uuid4(),
                    tenant_id=ctx.tenant,
                    agent_id=agent_id,
                    request_id=msg.request_id,
                    cycle_id=msg.cycle_id,
                    task_id=task_id,
                    environment_id=env_id,
                    trial=trial,
                    source="calibration" if msg.purpose == "calibrate" else "rollout",
                    model=model,
                    messages=result.messages,
                    # an episode the environment broke is kept ungraded: no reward, no verdict
                    reward=None if result.env_error else result.score.reward,
                    reward_breakdown={"checks": breakdown, **extra},
                    success=None if result.env_error else result.score.success,
                    tokens=result.tokens,
                    latency_ms=result.latency_ms,
                )
                .on_conflict_do_nothing(
                    index_elements=["tenant_id", "request_id", "task_id", "trial"]
                )
            )

    async def _summary(
        self, ctx: HandlerContext, request_id: uuid.UUID
    ) -> tuple[int, int, float, int]:
        """Trajectories, successes, the mean reward of the graded ones, and how many the
        environment broke (stored ungraded)."""
        async with ctx.store.tenant(ctx.tenant) as session:
            row = (
                await session.execute(
                    select(
                        func.count(),
                        func.count().filter(Trajectory.success.is_(True)),
                        func.coalesce(func.avg(Trajectory.reward), 0.0),
                        func.count().filter(Trajectory.reward.is_(None)),
                    ).where(Trajectory.request_id == request_id)
                )
            ).one()
        return int(row[0]), int(row[1]), float(row[2]), int(row[3])


def _seed(task: TaskSpec) -> int:
    """The environment's seed: fixed per task, so every trial of a task sees the same world."""
    seed = task.data.get("seed", 0)
    return seed if isinstance(seed, int) else 0


def _sampling(sampling: Sampling, trial: int) -> Sampling:
    """Trials of one task differ in their sampling seed (when one is set)."""
    if sampling.seed is None:
        return sampling
    return Sampling(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        seed=sampling.seed + 7919 * trial,
    )
