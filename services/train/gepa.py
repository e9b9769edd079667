"""GEPA-style prompt optimisation: the prompt-only baseline a cycle compares TRACE with.

Reflective prompt evolution with a Pareto pool (after GEPA, Agrawal et al. 2025), on the
target environment's train split and within a rollout budget:

1. The train tasks are split (seeded) into a Pareto set and a feedback set; the agent's
   own system prompt is scored on every Pareto task.
2. Each iteration picks a parent from the Pareto front (the candidates best on at least one
   Pareto task, drawn in proportion to how many tasks they lead), runs it on a minibatch of
   feedback tasks, and shows the reflection model the prompt, the transcripts, rewards and
   what the grader said was missed; the model answers with improved instructions (strict
   JSON, validated, retried with the problem fed back).
3. The child runs on the same minibatch; only if it does strictly better is it scored on
   the Pareto set and added to the pool.
4. The result is the candidate with the best mean Pareto score (the seed on ties).

Every episode counts against the budget; an iteration starts only if its worst case fits.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from shared.envs.protocol import Environment, Message, TaskSpec
from shared.envs.runner import EpisodeResult, run_episode
from shared.errors import RetryableError
from shared.llm.client import LLMClient
from shared.llm.structured import (
    AskConfig,
    MalformedReply,
    StructuredOutputError,
    ask_structured,
    decode_json,
)
from shared.logging import get_logger
from shared.messages import Sampling
from shared.serving.packaged import DEFAULT_AGENT_MODEL

log = get_logger(__name__)

REFLECT_SYSTEM = """\
You improve the instructions (system prompt) of an assistant that uses tools to help users.
You see its current instructions and some of its conversations with their scores and what
the grader found missing. Write better instructions: concrete rules that would have avoided
the failures (which tool to call first, which arguments and formats, when to ask the user,
what to tell the user at the end). Keep what works. Reply with one JSON object only:
{"prompt": "<the new instructions>"}"""


@dataclass(frozen=True)
class GEPASettings:
    budget: int
    """Episodes the optimisation may run, all included."""
    minibatch: int = 3
    pareto: int = 6
    reflection_model: str = DEFAULT_AGENT_MODEL
    agent_model: str = DEFAULT_AGENT_MODEL
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=1.0, max_tokens=256))
    max_turns: int = 6
    concurrency: int = 4
    max_prompt_chars: int = 4000
    transcript_chars: int = 900
    max_reflection_failures: int = 3
    """Consecutive unusable reflections after which the search stops."""
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
    scores: list[float]
    """Reward on each Pareto task."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores) if self.scores else 0.0


class GEPAResult(msgspec.Struct, kw_only=True):
    prompt: str
    score: float
    seed_score: float
    candidates: list[Candidate]
    rollouts: int
    iterations: int
    accepted: int
    resumes: list[int] = msgspec.field(default_factory=list)


class _Prompt(msgspec.Struct, frozen=True):
    prompt: str


class SearchState(msgspec.Struct, kw_only=True):
    """Everything the search needs to go on where it stopped: saved after the seed scoring
    and after every iteration, so a job that dies resumes on any worker without redoing (or
    paying again for) the iterations already done."""

    pool: list[Candidate]
    used: int
    iterations: int = 0
    accepted: int = 0
    failures: int = 0
    rng: list[Any]
    """`random.Random.getstate()`, as JSON lists."""
    resumes: list[int] = msgspec.field(default_factory=list)
    """The iteration each resume started from."""


class UnreadableCheckpointError(ValueError):
    """A saved search state that cannot be read back (starting over would pay twice)."""


class SearchCheckpoint:
    """The search state in one JSON file, replaced atomically."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "gepa.json"

    def load(self) -> SearchState | None:
        if not self.path.exists():
            return None
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=SearchState)
        except msgspec.DecodeError as exc:
            raise UnreadableCheckpointError(
                f"unreadable prompt-optimisation checkpoint {self.path}: {exc}"
            ) from exc

    def save(self, state: SearchState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(state))
        os.replace(tmp, self.path)


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _restore_rng(state: list[Any]) -> random.Random:
    rng = random.Random()
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
    return rng


class GEPA:
    def __init__(self, client: LLMClient, env: Environment, settings: GEPASettings) -> None:
        self.client = client
        self.env = env
        self.s = settings
        self.used = 0
        self._gate = asyncio.Semaphore(settings.concurrency)

    async def _run(self, prompt: str, tasks: Sequence[TaskSpec]) -> list[EpisodeResult]:
        async def one(task: TaskSpec) -> EpisodeResult:
            async with self._gate:
                return await run_episode(
                    self.client,
                    self.s.agent_model,
                    self.env,
                    task,
                    int(task.data.get("seed", 0)),
                    agent_prompt=prompt,
                    sampling=self.s.sampling,
                    max_turns=self.s.max_turns,
                )

        self.used += len(tasks)
        runs = list(await asyncio.gather(*(one(t) for t in tasks)))
        broken = [r.error for r in runs if r.model_error]
        if broken:
            # the endpoint failed, not the prompt: a zero here would steer the search
            raise RetryableError(f"model endpoint failed during prompt optimisation: {broken[0]}")
        return runs

    async def optimise(
        self,
        tasks: Sequence[TaskSpec],
        seed_prompt: str,
        checkpoint: SearchCheckpoint | None = None,
    ) -> GEPAResult:
        """Search within the budget; with `checkpoint`, resume a search that stopped."""
        rng = random.Random(f"gepa:{self.s.seed}")
        shuffled = sorted(tasks, key=lambda t: t.id)
        rng.shuffle(shuffled)
        pareto, feedback = shuffled[: self.s.pareto], shuffled[self.s.pareto :] or shuffled
        state = checkpoint.load() if checkpoint is not None else None
        if state is not None:
            rng = _restore_rng(state.rng)
            self.used = state.used
            state.resumes.append(state.iterations)
            log.info("prompt optimisation resumed", iteration=state.iterations, used=state.used)
        else:
            seed_runs = await self._run(seed_prompt, pareto)
            state = SearchState(
                pool=[Candidate(prompt=seed_prompt, parent=None, scores=_rewards(seed_runs))],
                used=self.used,
                rng=_rng_state(rng),
            )
        pool = state.pool

        def save() -> None:
            state.used, state.rng = self.used, _rng_state(rng)
            if checkpoint is not None:
                checkpoint.save(state)

        save()
        mb = min(self.s.minibatch, len(feedback))
        while self.used + 2 * mb + len(pareto) <= self.s.budget:
            if state.failures >= self.s.max_reflection_failures:
                break
            state.iterations += 1
            await self._iterate(state, rng, pareto, feedback, mb)
            save()
        best = max(range(len(pool)), key=lambda i: (pool[i].mean, -i))
        return GEPAResult(
            prompt=pool[best].prompt,
            score=pool[best].mean,
            seed_score=pool[0].mean,
            candidates=pool,
            rollouts=self.used,
            iterations=state.iterations,
            accepted=state.accepted,
            resumes=list(state.resumes),
        )

    async def _iterate(
        self,
        state: SearchState,
        rng: random.Random,
        pareto: Sequence[TaskSpec],
        feedback: Sequence[TaskSpec],
        mb: int,
    ) -> None:
        """One iteration: a parent from the Pareto front, a reflected child, kept if it beats
        the parent on the minibatch (then scored on the Pareto tasks)."""
        pool, iteration = state.pool, state.iterations
        parent_index = _pick_parent(pool, rng)
        parent = pool[parent_index]
        batch = rng.sample(list(feedback), mb)
        parent_runs = await self._run(parent.prompt, batch)
        try:
            child_prompt = await self._reflect(parent.prompt, batch, parent_runs, iteration)
        except StructuredOutputError as exc:
            state.failures += 1
            log.warning("reflection unusable", iteration=iteration, error=str(exc)[:300])
            return
        state.failures = 0
        child_runs = await self._run(child_prompt, batch)
        if sum(_rewards(child_runs)) <= sum(_rewards(parent_runs)):
            return
        scores = _rewards(await self._run(child_prompt, pareto))
        pool.append(Candidate(prompt=child_prompt, parent=parent_index, scores=scores))
        state.accepted += 1
        log.info("prompt candidate accepted", iteration=iteration, mean=round(pool[-1].mean, 3))

    async def _reflect(
        self,
        prompt: str,
        tasks: Sequence[TaskSpec],
        runs: Sequence[EpisodeResult],
        iteration: int,
    ) -> str:
        shown = []
        for task, run in zip(tasks, runs, strict=True):
            transcript = _transcript(run.messages)[-self.s.transcript_chars :]
            notes = "; ".join(run.score.notes) or "nothing missed"
            shown.append(
                f"## Task {task.id} (reward {run.score.reward:.2f}; grader: {notes})\n{transcript}"
            )
        user = (
            f"# Current instructions\n{prompt or '(none)'}\n\n# Conversations\n"
            + "\n\n".join(shown)
            + "\n\nWrite the improved instructions as JSON."
        )

        def parse(reply: str) -> str:
            new = decode_json(reply, _Prompt).prompt.strip()
            if not new:
                raise MalformedReply("the prompt is empty")
            if len(new) > self.s.max_prompt_chars:
                raise MalformedReply(
                    f"the prompt has {len(new)} characters; at most {self.s.max_prompt_chars}"
                )
            return new

        return await ask_structured(
            self.client,
            AskConfig(model=self.s.reflection_model, temperature=0.7, max_tokens=768),
            [Message(role="system", content=REFLECT_SYSTEM), Message(role="user", content=user)],
            seed=self.s.seed + iteration,
            parse=parse,
            what="improved prompt",
        )


def _rewards(runs: Sequence[EpisodeResult]) -> list[float]:
    return [float(r.score.reward) for r in runs]


def _pick_parent(pool: Sequence[Candidate], rng: random.Random) -> int:
    """A candidate on the Pareto front, drawn by how many Pareto tasks it leads."""
    leads = [0] * len(pool)
    for task in range(len(pool[0].scores)):
        best = max(c.scores[task] for c in pool)
        for i, c in enumerate(pool):
            if c.scores[task] == best:
                leads[i] += 1
    return rng.choices(range(len(pool)), weights=leads)[0]


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
