"""What a cycle has gathered so far, typed per stage (`cycles.data`, JSONB).

Each stage adds its own part when the cycle enters it and the events of that stage fill it
in; nothing is keyed by string prefixes. `load` reads a cycle's data (a row that does not
decode is a bug or a hand edit, and says which field is wrong), `save` writes it back as a
whole (JSONB columns only see reassignment). Migration 0004 moved the cycles written before
this shape to it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.messages import CycleSettings
from shared.store.models import Cycle

BASE = "base"
ROUTED = "routed"
PRODUCTION = "production"

JOB_FAILED = "failed"
"""A job's outcome when it produced nothing (else the adapter id, or `PROMPT`)."""
PROMPT = "prompt"
"""A prompt-optimisation job's outcome (its prompt is in the job's config)."""


def adapter_config(name: str) -> str:
    """The evaluation configuration of one adapter."""
    return f"adapter:{name}"


def baseline_config(name: str) -> str:
    """The evaluation configuration of one baseline (`grpo_target`, `gepa`)."""
    return f"baseline:{name}"


class Settlement(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A capability's synthesis outcome: its environment, or why there is none."""

    environment: str | None = None
    reason: str = ""


class Diagnosis(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str
    """The diagnosis rollout."""
    early: dict[str, Settlement] = {}
    """Synthesis outcomes that arrived before `capabilities.identified` reached this service
    (both services consume it); applied when it does."""


class Synthesis(msgspec.Struct, kw_only=True, omit_defaults=True):
    capabilities: list[str]
    """Being synthesized, best first; a reserve that stands in for a failed one is appended."""
    reserves: list[str] = []
    """Kept capabilities waiting for a place (the next takes a failed one's)."""
    spares: list[str] = []
    """Reserves synthesized beside the capabilities from the start
    (`CycleSettings.spare_capabilities`): the first spare not failed takes a failed
    capability's place without a synthesis of its own to wait for."""
    settled: dict[str, Settlement] = {}

    def failures(self) -> dict[str, str]:
        return {c: s.reason for c, s in self.settled.items() if s.environment is None}

    def ready(self) -> dict[str, str]:
        """Capability -> environment, for the capabilities (not the unused spares) that got
        one."""
        return {
            c: s.environment
            for c, s in self.settled.items()
            if s.environment is not None and c in self.capabilities
        }

    def pending(self) -> list[str]:
        """Capabilities still being synthesized."""
        return [c for c in self.capabilities if c not in self.settled]

    def available_spares(self) -> list[str]:
        """Spares that can take a failed capability's place: not given one yet, and not
        failed themselves (still being synthesized, or ready)."""
        return [
            spare
            for spare in self.spares
            if spare not in self.capabilities
            and (spare not in self.settled or self.settled[spare].environment is not None)
        ]

    def complete(self) -> bool:
        """Every capability has an outcome, and no spare is still being synthesized (its
        calibration would compete with training for the machine)."""
        return set(self.settled) >= {*self.capabilities, *self.spares}


class Training(msgspec.Struct, kw_only=True, omit_defaults=True):
    jobs: dict[str, str | None]
    """Job id -> its outcome (an adapter id, `PROMPT` or `JOB_FAILED`), None while it runs."""
    baselines: dict[str, str] = {}
    """Job id -> the baseline it trains (the other jobs train a capability's adapter)."""
    failures: dict[str, str] = {}
    """Job id -> why it failed."""

    def complete(self) -> bool:
        return all(outcome is not None for outcome in self.jobs.values())


class Evaluation(msgspec.Struct, kw_only=True, omit_defaults=True):
    requests: dict[str, str]
    """Configuration -> its rollout request on the test split."""
    route_requests: dict[str, str] = {}
    """Configuration -> its rollout on train tasks, what the learned router is fitted on."""
    done: list[str] = []
    """Request ids whose rollout has completed."""
    adapters: list[str] = []
    """The cycle's new adapters (the routed set)."""
    production: list[str] = []
    """The agent's production adapters at the time (the incumbent, when there are some)."""
    deferred: dict[str, str] = {}
    """Configuration -> adapter name, for adapters played only on the test tasks routing
    sends them (`CycleSettings.eval_adapters` = `routed`): requested once the base model's
    rollout (and the learned router's data) has shown each task's opening request."""
    played_on: dict[str, list[str]] = {}
    """A deferred configuration -> the test tasks routing sent it (and it was played on);
    filled when the deferred requests go out."""

    def awaiting_routing(self) -> bool:
        """Every request so far has completed and the deferred ones are not yet requested."""
        return bool(self.deferred) and not self.played_on and self._requested_done()

    def complete(self) -> bool:
        return self._requested_done() and (not self.deferred or bool(self.played_on))

    def _requested_done(self) -> bool:
        return set(self.done) >= {*self.requests.values(), *self.route_requests.values()}


class CycleData(msgspec.Struct, kw_only=True, omit_defaults=True):
    settings: CycleSettings = CycleSettings()
    diagnosis: Diagnosis | None = None
    synthesis: Synthesis | None = None
    training: Training | None = None
    evaluation: Evaluation | None = None
    untrained: str | None = None
    """Why the cycle has nothing to promote (it still evaluates the agent as it is)."""
    report: dict[str, Any] | None = None
    """The evaluation's report (`services/evaluator/promotion.py`), once completed."""


class CorruptCycleData(ValueError):
    """A cycle's stored data does not have the shape of `CycleData`."""


def load(cycle: Cycle) -> CycleData:
    try:
        return msgspec.convert(cycle.data or {}, CycleData)
    except msgspec.ValidationError as exc:
        raise CorruptCycleData(f"cycle {cycle.id}: stored data is not a cycle's: {exc}") from exc


def save(cycle: Cycle, data: CycleData) -> None:
    cycle.data = msgspec.to_builtins(data)
