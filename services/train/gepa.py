"""The GEPA baseline: the agent's system prompt optimised by the reference implementation
(PyPI `gepa`, Agrawal et al. 2025) on the target's train split, within a rollout budget.

retrace supplies what `gepa` asks of a system (its `GEPAAdapter` protocol), and `gepa` owns
the search (a Pareto pool over the validation tasks, reflective mutation, acceptance on the
minibatch):
- `EpisodeAdapter.evaluate` plays a candidate prompt on a batch of train tasks through the
  inference endpoint; each episode is one metric call, its reward the score;
- `EpisodeAdapter.make_reflective_dataset` shows the reflection model each conversation with
  its reward and what the grader found missing;
- the reflection model is a model on the same endpoint.

The search is synchronous, so it runs in a thread and sends its episodes and reflection calls
back to the event loop. The budget counts every episode, and an iteration starts only if its
worst case (the minibatch for parent and child, then the validation tasks) still fits. The
checkpoint is gepa's own run directory: a search that stopped (a lost worker, a SIGTERM)
resumes there from the last iteration it finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import pickle
import random
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from gepa import optimize
from gepa.core.adapter import EvaluationBatch
from gepa.core.state import GEPAState

from shared.envs.protocol import Environment, Message, TaskSpec
from shared.envs.runner import EpisodeResult, run_episode
from shared.errors import Cancelled, RetryableError
from shared.llm.client import LLMClient
from shared.llm.openai_types import ChatRequest
from shared.logging import get_logger
from shared.messages import Sampling
from shared.serving.packaged import DEFAULT_AGENT_MODEL

log = get_logger(__name__)
COMPONENT = "system_prompt"
"""The one text component optimised: the agent's system prompt."""
T = TypeVar("T")


@dataclass(frozen=True)
class GEPASettings:
    budget: int
    """Episodes the optimisation may run, all included."""
    minibatch: int = 3
    """Train tasks a parent and its child are compared on (gepa's reflection minibatch)."""
    pareto: int = 6
    """Train tasks held for gepa's validation (Pareto) set."""
    reflection_model: str = DEFAULT_AGENT_MODEL
    agent_model: str = DEFAULT_AGENT_MODEL
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=1.0, max_tokens=256))
    max_turns: int = 6
    concurrency: int = 4
    transcript_chars: int = 900
    """Characters of each conversation the reflection model reads (its end)."""
    reflection_max_tokens: int = 768
    seed: int = 0

    def __post_init__(self) -> None:
        if self.minibatch < 1 or self.pareto < 1:
            raise ValueError("minibatch and pareto must be at least 1")
        if self.budget < self.pareto:
            raise ValueError(
                f"a budget of {self.budget} episodes cannot even score the seed prompt on "
                f"{self.pareto} Pareto tasks"
            )


class Candidate(msgspec.Struct, kw_only=True):
    prompt: str
    parent: int | None
    score: float
    """Mean reward on the validation tasks."""


class GEPAResult(msgspec.Struct, kw_only=True):
    prompt: str
    score: float
    seed_score: float
    candidates: list[Candidate]
    rollouts: int
    iterations: int
    accepted: int
    resumes: list[int] = msgspec.field(default_factory=list)
    """The iteration each resume started from."""


class UnreadableCheckpointError(ValueError):
    """A saved search state that cannot be read back (starting over would pay twice)."""


class SearchCheckpoint:
    """gepa's run directory for one job, with the resumes it saw."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_path = directory / "gepa_state.bin"
        self.resumes_path = directory / "resumes.json"
        self.spent_path = directory / "spent.json"

    def iterations(self) -> int | None:
        """Iterations the saved search finished (None: nothing saved yet)."""
        if not self.state_path.exists():
            return None
        try:
            with self.state_path.open("rb") as f:
                saved = pickle.load(f)  # gepa's own format, written by this job only
            return int(saved["i"]) + 1
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
            raise UnreadableCheckpointError(
                f"unreadable prompt-optimisation checkpoint {self.state_path}: {exc!r}"
            ) from exc

    def resumes(self) -> list[int]:
        if not self.resumes_path.exists():
            return []
        return [int(i) for i in json.loads(self.resumes_path.read_text())]

    def spent(self) -> int:
        """Episodes played by every run of this search so far."""
        if not self.spent_path.exists():
            return 0
        return int(json.loads(self.spent_path.read_text()))

    def note_spent(self, episodes: int) -> None:
        tmp = self.spent_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(episodes))
        tmp.replace(self.spent_path)

    def note_resume(self, iteration: int) -> list[int]:
        resumes = [*self.resumes(), iteration]
        self.resumes_path.write_text(json.dumps(resumes))
        return resumes


class _Loop:
    """Runs coroutines on the event loop from the search's thread; `stop` cancels what is in
    flight and refuses more, which ends the search with `_Stopped`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.stopped = threading.Event()
        self._flying: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self.stopped.is_set():
                coro.close()
                raise _Stopped
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._flying.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError as exc:
            raise _Stopped from exc
        finally:
            with self._lock:
                self._flying.discard(future)

    def stop(self) -> None:
        with self._lock:
            self.stopped.set()
            for future in self._flying:
                future.cancel()


class _Log:
    """gepa's logger, into structlog: without one gepa swaps the process's stdout and stderr
    for its own files for the whole search, which two searches at once leave broken."""

    def log(self, message: str) -> None:
        log.debug("gepa", message=message[:2000])


class _WorstCaseBudget:
    """gepa's stop condition: no iteration starts that could run past the budget, counting
    every episode played (`spent`), also those gepa does not count (a resumed search scores
    its seed again, and an interrupted iteration is played again)."""

    def __init__(self, budget: int, worst: int, spent: Callable[[], int]) -> None:
        self.budget = budget
        self.worst = worst
        self.spent = spent

    def __call__(self, gepa_state: GEPAState[Any, Any]) -> bool:
        used = max(gepa_state.total_num_evals, self.spent())
        return used + self.worst > self.budget


class _Stopped(Exception):
    """The job is stopping: the search thread unwinds (its last iteration is saved)."""


class EpisodeAdapter:
    """gepa's `GEPAAdapter` over retrace's environment protocol and inference endpoint."""

    propose_new_texts = None  # gepa's own reflective proposer

    def __init__(
        self, play: Callable[[str, Sequence[TaskSpec]], list[EpisodeResult]], s: GEPASettings
    ) -> None:
        self.play = play
        self.s = s

    def evaluate(
        self, batch: list[TaskSpec], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch[dict[str, Any], dict[str, Any]]:
        runs = self.play(candidate[COMPONENT], batch)
        records: list[dict[str, Any]] = [
            {
                "task": task.id,
                "request": _first_user_text(run.messages),
                "transcript": _transcript(run.messages)[-self.s.transcript_chars :],
                "reward": float(run.score.reward),
                "notes": list(run.score.notes),
            }
            for task, run in zip(batch, runs, strict=True)
        ]
        return EvaluationBatch(
            outputs=records,
            scores=[r["reward"] for r in records],
            trajectories=records if capture_traces else None,
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: EvaluationBatch[dict[str, Any], dict[str, Any]],
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, Any]]]:
        shown = [
            {
                "Inputs": record["request"],
                "Generated Outputs": record["transcript"],
                "Feedback": f"reward {record['reward']:.2f}; the grader found missing: "
                + ("; ".join(record["notes"]) or "nothing"),
            }
            for record in eval_batch.trajectories or eval_batch.outputs
        ]
        return {name: shown for name in components_to_update}


class GEPA:
    def __init__(
        self,
        client: LLMClient,
        env: Environment,
        settings: GEPASettings,
        on_spent: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """`on_spent(n)`: called as episodes finish (progress; may raise to stop the search)."""
        self.client = client
        self.env = env
        self.s = settings
        self.on_spent = on_spent
        self.used = 0
        self._gate = asyncio.Semaphore(settings.concurrency)
        self._reflections = 0
        self._reflected = 0
        self._reflection_error: BaseException | None = None
        self._checkpoint: SearchCheckpoint | None = None

    async def _episodes(self, prompt: str, tasks: Sequence[TaskSpec]) -> list[EpisodeResult]:
        async def one(task: TaskSpec) -> EpisodeResult:
            async with self._gate:
                # spent once it starts: an episode cut off in flight may have cost the
                # endpoint its work, and counting it keeps the budget on the safe side
                self.used += 1
                if self._checkpoint is not None:
                    self._checkpoint.note_spent(self.used)
                result = await run_episode(
                    self.client,
                    self.s.agent_model,
                    self.env,
                    task,
                    int(task.data.get("seed", 0)),
                    agent_prompt=prompt,
                    sampling=self.s.sampling,
                    max_turns=self.s.max_turns,
                )
            if self.on_spent is not None:
                with contextlib.suppress(Cancelled):  # the job's cancel watch stops the search
                    await self.on_spent(1)
            return result

        runs = list(await asyncio.gather(*(one(t) for t in tasks)))
        broken = [r.error for r in runs if r.model_error]
        if broken:
            # the endpoint failed, not the prompt: a zero here would steer the search
            raise RetryableError(f"model endpoint failed during prompt optimisation: {broken[0]}")
        broken = [f"{t.id}: {r.error}" for t, r in zip(tasks, runs, strict=True) if r.env_error]
        if broken:
            # the environment failed, not the prompt: an episode it could not grade scores
            # nothing, and counting it as 0 would steer the search away from a good prompt
            raise RetryableError(f"environment failed during prompt optimisation: {broken[0]}")
        return runs

    async def _reflect(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = (
            [Message(role="user", content=prompt)]
            if isinstance(prompt, str)
            else [msgspec.convert(m, Message) for m in prompt]
        )
        self._reflections += 1
        try:
            reply = await self.client.chat(
                ChatRequest(
                    model=self.s.reflection_model,
                    messages=messages,
                    temperature=0.7,
                    max_tokens=self.s.reflection_max_tokens,
                    seed=self.s.seed + self._reflections,
                )
            )
        except Exception as exc:  # counted here; gepa logs it and goes on
            self._reflection_error = exc
            log.warning("reflection failed", model=self.s.reflection_model, error=repr(exc))
            raise
        self._reflected += 1
        return reply.choices[0].message.content or ""

    async def optimise(
        self,
        tasks: Sequence[TaskSpec],
        seed_prompt: str,
        checkpoint: SearchCheckpoint | None = None,
    ) -> GEPAResult:
        """Search within the budget; with `checkpoint`, resume a search that stopped."""
        with contextlib.ExitStack() as scratch:
            if checkpoint is None:
                checkpoint = SearchCheckpoint(
                    Path(scratch.enter_context(tempfile.TemporaryDirectory()))
                )
            return await self._optimise(tasks, seed_prompt, checkpoint)

    async def _optimise(
        self, tasks: Sequence[TaskSpec], seed_prompt: str, checkpoint: SearchCheckpoint
    ) -> GEPAResult:
        shuffled = sorted(tasks, key=lambda t: t.id)
        random.Random(f"gepa:{self.s.seed}").shuffle(shuffled)
        valset, trainset = shuffled[: self.s.pareto], shuffled[self.s.pareto :] or shuffled
        minibatch = min(self.s.minibatch, len(trainset))
        worst = 2 * minibatch + len(valset)
        done = checkpoint.iterations()
        resumes = checkpoint.resumes()
        self._checkpoint = checkpoint
        self.used = checkpoint.spent()
        if done is not None:
            resumes = checkpoint.note_resume(done)
            log.info("prompt optimisation resumed", iteration=done)
        checkpoint.directory.mkdir(parents=True, exist_ok=True)
        (checkpoint.directory / "gepa.stop").unlink(missing_ok=True)
        bridge = _Loop(asyncio.get_running_loop())

        def play(prompt: str, batch: Sequence[TaskSpec]) -> list[EpisodeResult]:
            return bridge.run(self._episodes(prompt, batch))

        def reflect(prompt: str | list[dict[str, Any]]) -> str:
            return bridge.run(self._reflect(prompt))

        def search() -> Any:
            return optimize(
                seed_candidate={COMPONENT: seed_prompt},
                trainset=list(trainset),
                valset=list(valset),
                adapter=EpisodeAdapter(play, self.s),  # type: ignore[arg-type]
                reflection_lm=reflect,
                reflection_minibatch_size=minibatch,
                candidate_selection_strategy="pareto",
                max_metric_calls=self.s.budget,
                stop_callbacks=[_WorstCaseBudget(self.s.budget, worst, lambda: self.used)],
                run_dir=str(checkpoint.directory),
                seed=self.s.seed,
                raise_on_exception=True,
                display_progress_bar=False,
                logger=_Log(),
            )

        work = asyncio.ensure_future(asyncio.to_thread(search))
        try:
            result = await asyncio.shield(work)
        except asyncio.CancelledError:
            # stop the search where it is; its last finished iteration is saved
            (checkpoint.directory / "gepa.stop").touch()
            bridge.stop()
            await asyncio.wait([work])
            raise
        except _Stopped as exc:  # stopped from outside the loop's cancellation (not expected)
            raise RetryableError("prompt optimisation was stopped") from exc
        iterations = checkpoint.iterations() or 0
        if self._reflections and not self._reflected:
            # gepa logs a failed reflection and goes on; none ever answering is no search
            raise RetryableError(
                f"the reflection model {self.s.reflection_model!r} never answered "
                f"({self._reflections} tries): {self._reflection_error!r}"
            )
        candidates = [
            Candidate(
                prompt=c[COMPONENT],
                parent=next((p for p in result.parents[i] if p is not None), None),
                score=float(result.val_aggregate_scores[i]),
            )
            for i, c in enumerate(result.candidates)
        ]
        best = max(range(len(candidates)), key=lambda i: (candidates[i].score, -i))
        return GEPAResult(
            prompt=candidates[best].prompt,
            score=candidates[best].score,
            seed_score=candidates[0].score,
            candidates=candidates,
            rollouts=self.used,
            iterations=iterations,
            accepted=len(candidates) - 1,
            resumes=resumes,
        )


def _first_user_text(messages: Sequence[dict[str, Any]]) -> str:
    return next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")


def _transcript(messages: Sequence[dict[str, Any]]) -> str:
    out = []
    for m in messages:
        if m.get("role") == "system":
            continue
        text = str(m.get("content") or "")
        calls = m.get("tool_calls") or []
        if calls:
            text += " " + " ".join(
                f"[call {c['function']['name']}({c['function']['arguments']})]" for c in calls
            )
        out.append(f"{m.get('role')}: {text.strip()}")
    return "\n".join(out)
