"""A TRACE cycle as a state machine in Postgres (`cycles.state`, progress in `cycles.data`).

    diagnosing   a diagnosis rollout (train split) runs; contrast names capabilities
    synthesizing one environment per capability is synthesized and calibrated
    training       one GRPO job per ready environment
    evaluating     the test split: the base model, each adapter (and the production adapters),
                   same tasks, same seeds; the routed set is scored by routing each task
    completed      promoted or rejected, with the reason (`cycles.reason`)
    failed         the cycle could not go on (the agent was deleted, a duplicate cycle)

A stage that leaves nothing to train (no capability kept, no environment calibrated, no
adapter trained) does not end the cycle: it goes straight to evaluating with the base model
(and the production adapters, and any baseline that was trained), so the report measures where
the agent stands, and completes rejected with the reason (`data["untrained"]`).

Every transition happens in the handler of the event that completes a stage, in that
handler's transaction, and checks the state it expects first: a repeated or late event
changes nothing, so any service can crash and restart without losing or duplicating work.
"""

from __future__ import annotations

import uuid
from typing import Any

DIAGNOSING = "diagnosing"
SYNTHESIZING = "synthesizing"
TRAINING = "training"
EVALUATING = "evaluating"
COMPLETED = "completed"
FAILED = "failed"
ACTIVE = (DIAGNOSING, SYNTHESIZING, TRAINING, EVALUATING)
BASE = "base"
ROUTED = "routed"
PRODUCTION = "production"
ROUTE = "route:"
"""Prefix of the train-task rollouts the learned router is fitted on (`data["evaluations"]`)."""
JOB_FAILED = "failed"
PROMPT = "prompt"
"""A prompt-optimisation job's entry once done (its prompt is in the job's config)."""
"""A job's entry in `data["jobs"]` when it produced no adapter (else the adapter id)."""


def adapter_config(name: str) -> str:
    return f"adapter:{name}"


def baseline_config(name: str) -> str:
    return f"baseline:{name}"


def ids(values: list[Any]) -> list[uuid.UUID]:
    return [uuid.UUID(str(v)) for v in values]
