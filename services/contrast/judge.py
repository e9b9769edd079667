"""The LLM judge: proposes candidate capabilities and labels them, through `LLMClient`.

`JudgeProposer` shows the judge a seeded sample of failed and successful trajectories and
asks for capabilities as JSON. `JudgeLabeller` is the `Labeller` the criterion calls
synchronously; its labels are fetched beforehand by `prelabel`, one judge call per
(trajectory, run) labelling every capability at once. That is len(trajectories) x len(runs)
calls: for `criterion.evaluate` with R runs, `criterion_runs(cfg)` (R resamples plus the
full-set run, R + 1 in all) labels every trajectory in every run, even those a resample
leaves out; pass fewer runs to spend less.

Replies are strict JSON checked with msgspec (a reply that is one ```json fence is unwrapped,
nothing else is repaired), through `shared.llm.structured`: a malformed reply is retried with
what was wrong fed back, up to `max_attempts` replies, then `JudgeOutputError`. Endpoint
failures are the client's: `LLMError` after its retry policy, `LLMRequestError` at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from services.contrast import judge_prompts as prompts
from services.contrast.criterion import CriterionConfig
from services.contrast.labels import Capability, Label
from services.contrast.trajectory import TrajectoryView
from shared.envs.protocol import Message
from shared.llm.client import LLMClient
from shared.llm.structured import (
    AskConfig,
    MalformedReply,
    StructuredOutputError,
    ask_structured,
    decode_json,
)
from shared.logging import get_logger

T = TypeVar("T")
LabelKey = tuple[str, str, int]
"""(capability name, trajectory id, run)."""
MIN_TRAJECTORY_CHARS = 400
"""Fewest characters of one compacted trajectory worth showing a judge."""
log = get_logger(__name__)


class JudgeOutputError(StructuredOutputError):
    """The judge gave no usable reply in `max_attempts` tries; the message says what was wrong."""


@dataclass(frozen=True)
class JudgeConfig:
    model: str
    """Model name sent to the OpenAI-compatible endpoint."""
    temperature: float = 0.7
    """Positive, so repeated labelings (different seeds) are independent samples."""
    max_tokens: int = 1024
    """Reply budget; a reply cut off here is malformed JSON and retried."""
    concurrency: int = 4
    """Judge calls in flight at once during `prelabel`."""
    max_attempts: int = 3
    """Replies asked for per prompt before `JudgeOutputError` (the first included)."""
    max_prompt_chars: int = 16_000
    """Most characters of one user message, trajectories included."""
    seed: int = 0
    """Sampling seed: the proposer's selection and request; labelling run r uses seed + r."""
    examples_per_side: int = 4
    """Most failed, and most successful, trajectories the proposer shows."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        for field in ("max_tokens", "concurrency", "max_attempts", "examples_per_side"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be at least 1, got {getattr(self, field)}")
        if self.max_prompt_chars < 2 * MIN_TRAJECTORY_CHARS:
            raise ValueError(f"max_prompt_chars too small: {self.max_prompt_chars}")


def criterion_runs(cfg: CriterionConfig) -> range:
    """The runs `criterion.evaluate` asks labels for: 0..R-1 and the full-set run R."""
    return range(cfg.runs + 1)


_Malformed = MalformedReply


# -- proposing -------------------------------------------------------------------------------


class _Proposal(msgspec.Struct, frozen=True):
    name: str
    definition: str


class _Proposals(msgspec.Struct, frozen=True):
    capabilities: list[_Proposal]


class JudgeProposer:
    """Candidate capabilities from one judge call over a sample of failures and successes."""

    def __init__(self, client: LLMClient, config: JudgeConfig) -> None:
        self.client = client
        self.config = config

    async def propose(
        self, trajectories: Sequence[TrajectoryView], *, max_candidates: int = 10
    ) -> list[Capability]:
        """Up to `max_candidates` capabilities, unique by name; [] without a failure."""
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be at least 1, got {max_candidates}")
        failed, succeeded = self._sample(trajectories)
        if not failed:
            return []
        user = self._prompt(failed, succeeded, max_candidates)
        return await _ask(
            self.client,
            self.config,
            [
                Message(role="system", content=prompts.PROPOSE_SYSTEM),
                Message(role="user", content=user),
            ],
            seed=self.config.seed,
            parse=lambda reply: _capabilities(reply, max_candidates),
            what="capabilities",
        )

    def _sample(
        self, trajectories: Sequence[TrajectoryView]
    ) -> tuple[list[TrajectoryView], list[TrajectoryView]]:
        """The same number at most of each side, drawn with the config's seed."""
        rng = random.Random(self.config.seed)
        k = self.config.examples_per_side
        sides = ([t for t in trajectories if not t.success], [t for t in trajectories if t.success])
        failed, succeeded = (rng.sample(side, min(k, len(side))) for side in sides)
        return failed, succeeded

    def _prompt(
        self, failed: list[TrajectoryView], succeeded: list[TrajectoryView], max_candidates: int
    ) -> str:
        """The prompt with every shown trajectory given an equal share of the budget; fewer
        trajectories (dropping from the larger side) when the shares would be too small."""
        room = self.config.max_prompt_chars - len(prompts.propose_prompt([], [], max_candidates))

        def share() -> int:
            return room // (len(failed) + len(succeeded)) - prompts.EPISODE_HEADER_CHARS

        while share() < MIN_TRAJECTORY_CHARS and len(failed) + len(succeeded) > 1:
            (succeeded if len(succeeded) >= len(failed) else failed).pop()
        each = share()
        if each < MIN_TRAJECTORY_CHARS:
            raise ValueError(
                f"max_prompt_chars={self.config.max_prompt_chars} leaves {each} characters "
                "for one trajectory in the proposer's prompt; raise it"
            )
        return prompts.propose_prompt(
            [prompts.compact(t, each) for t in failed],
            [prompts.compact(t, each) for t in succeeded],
            max_candidates,
        )


def _capabilities(reply: str, max_candidates: int) -> list[Capability]:
    """Valid, first-named capabilities; invalid entries are dropped (logged), but a reply
    with entries and none valid is malformed."""
    proposals = _decode(reply, _Proposals).capabilities
    out: dict[str, Capability] = {}
    rejected: list[str] = []
    for p in proposals:
        try:
            capability = Capability(p.name, p.definition.strip())
        except ValueError as exc:
            rejected.append(str(exc))
            continue
        out.setdefault(capability.name, capability)
    if rejected:
        log.warning("judge proposals dropped", rejected=rejected)
    if proposals and not out:
        raise _Malformed("no valid capability: " + "; ".join(rejected))
    return list(out.values())[:max_candidates]


# -- labelling -------------------------------------------------------------------------------


class _Labels(msgspec.Struct, frozen=True):
    labels: dict[str, Label]


class JudgeLabeller:
    """A `Labeller` answering from labels fetched by `prelabel`."""

    def __init__(self, client: LLMClient, config: JudgeConfig) -> None:
        self.client = client
        self.config = config
        self.labels: dict[LabelKey, Label] = {}

    def label(self, capability: Capability, trajectory: TrajectoryView, run: int) -> Label:
        try:
            return self.labels[(capability.name, trajectory.id, run)]
        except KeyError:
            raise KeyError(
                f"no judge label for capability {capability.name!r} on trajectory "
                f"{trajectory.id} in run {run}: await prelabel() with them first"
            ) from None

    async def prelabel(
        self,
        capabilities: Sequence[Capability],
        trajectories: Sequence[TrajectoryView],
        runs: Iterable[int],
    ) -> dict[LabelKey, Label]:
        """Every capability's label on every trajectory in every run, also kept for `label`:
        one call per (distinct trajectory, run), at most `concurrency` in flight."""
        if not capabilities:
            return {}
        unique = list({t.id: t for t in trajectories}.values())
        room = self.config.max_prompt_chars - len(prompts.label_prompt(capabilities, ""))
        if room < MIN_TRAJECTORY_CHARS:
            raise ValueError(
                f"max_prompt_chars={self.config.max_prompt_chars} leaves {room} characters for "
                f"the trajectory after {len(capabilities)} capability definitions; raise it or "
                "label fewer capabilities at once"
            )
        gate = asyncio.Semaphore(self.config.concurrency)
        found: dict[LabelKey, Label] = {}

        async def one(trajectory: TrajectoryView, run: int) -> None:
            async with gate:
                labels = await self._label_all(capabilities, trajectory, run, room)
            found.update({(name, trajectory.id, run): v for name, v in labels.items()})

        # A TaskGroup cancels the other calls once one fails; the caller gets that first
        # failure itself (a JudgeOutputError, an LLMError), not an ExceptionGroup.
        try:
            async with asyncio.TaskGroup() as group:
                for run in runs:
                    for trajectory in unique:
                        group.create_task(one(trajectory, run))
        except ExceptionGroup as errors:
            raise errors.exceptions[0] from None
        self.labels.update(found)
        return found

    async def _label_all(
        self,
        capabilities: Sequence[Capability],
        trajectory: TrajectoryView,
        run: int,
        room: int,
    ) -> dict[str, Label]:
        user = prompts.label_prompt(capabilities, prompts.compact(trajectory, room))
        names = [c.name for c in capabilities]
        return await _ask(
            self.client,
            self.config,
            [
                Message(role="system", content=prompts.LABEL_SYSTEM),
                Message(role="user", content=user),
            ],
            seed=self.config.seed + run,
            parse=lambda reply: _labels(reply, names),
            what=f"labels for trajectory {trajectory.id} in run {run}",
        )


def _labels(reply: str, names: Sequence[str]) -> dict[str, Label]:
    labels = _decode(reply, _Labels).labels
    missing = [n for n in names if n not in labels]
    unknown = sorted(set(labels) - set(names))
    if missing or unknown:
        problems = [f"missing labels for {missing}"] if missing else []
        problems += [f"labels for unknown capabilities {unknown}"] if unknown else []
        raise _Malformed(f"{'; '.join(problems)}; label exactly {list(names)}")
    return {n: labels[n] for n in names}


# -- asking ----------------------------------------------------------------------------------

_decode = decode_json


async def _ask(
    client: LLMClient,
    config: JudgeConfig,
    prompt: list[Message],
    *,
    seed: int,
    parse: Callable[[str], T],
    what: str,
) -> T:
    ask = AskConfig(
        model=config.model,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        max_attempts=config.max_attempts,
    )
    return await ask_structured(
        client, ask, prompt, seed=seed, parse=parse, what=what, error=JudgeOutputError
    )
