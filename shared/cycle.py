"""The TRACE cycle's states and the only transitions between them.

    requested     recorded by the control API, its request published; the evaluator has
                  not taken it yet (a request from elsewhere has no row until it is taken)
    diagnosing    a diagnosis rollout (train split) runs; contrast names capabilities
    synthesizing  one environment per capability is synthesized and calibrated
    training      one GRPO job per ready environment, and the baselines
    evaluating    the test split: the base model, each adapter (and the production adapters
                  and baselines), same tasks, same seeds; the routed set is scored by routing
                  each task
    completed     promoted or rejected, with the reason (`cycles.reason`)
    failed        the cycle could not go on (an active cycle already, over the tenant's
                  quota, the agent deleted, a stage stalled, cancelled)

`TRANSITIONS` is the table; `move` is the only way a handler changes a cycle's state, and it
refuses a step the table does not list, so the diagram in docs/architecture.md (`mermaid`,
checked by tests/unit/test_cycle_machine.py) is the code's own.

A stage that leaves nothing to train (no capability kept, no environment calibrated, no
adapter trained) does not end the cycle: it goes straight to evaluating with the base model
(and the production adapters, and any baseline that was trained), so the report says where
the agent stands, and the cycle completes rejected, saying why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shared.store.models import Cycle


class State(enum.StrEnum):
    REQUESTED = "requested"
    DIAGNOSING = "diagnosing"
    SYNTHESIZING = "synthesizing"
    TRAINING = "training"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    FAILED = "failed"


ACTIVE = (State.REQUESTED, State.DIAGNOSING, State.SYNTHESIZING, State.TRAINING, State.EVALUATING)
ENDED = (State.COMPLETED, State.FAILED)

STALL = "stall"
"""The event of the stall watch (`services/evaluator/stall.py`), not a bus message."""
CANCEL = "cancel"
"""`retrace cancel` on a cycle (`shared/cli/work.py`), not a bus message."""
REQUEST = "request"
"""The control API recording a cycle before it publishes its request, not a bus message."""


@dataclass(frozen=True)
class Transition:
    source: State | None
    """None: the cycle does not exist yet."""
    target: State
    on: tuple[str, ...]
    """The events that can take it (contract class names, or `STALL`)."""
    when: str
    """The condition, as the diagram shows it."""


_SETTLED = ("EnvironmentReady", "SynthesisFailed", "CapabilitiesIdentified")
"""A capability's synthesis outcome; `capabilities.identified` applies those that came early."""
_JOB_DONE = ("AdapterTrained", "PromptOptimized", "TrainingFailed")

TRANSITIONS: tuple[Transition, ...] = (
    Transition(None, State.REQUESTED, (REQUEST,), "started over the control API"),
    *(
        Transition(source, target, ("CycleRequested",), when)
        for source in (None, State.REQUESTED)
        for target, when in (
            (State.DIAGNOSING, "no other cycle of the agent active, within quota"),
            (State.FAILED, "another cycle of the agent active, or over quota"),
        )
    ),
    Transition(State.DIAGNOSING, State.SYNTHESIZING, ("CapabilitiesIdentified",), "kept some"),
    Transition(State.DIAGNOSING, State.EVALUATING, ("CapabilitiesIdentified",), "kept none: as is"),
    Transition(
        State.SYNTHESIZING, State.TRAINING, _SETTLED, "last capability settled, an env ready"
    ),
    Transition(State.SYNTHESIZING, State.EVALUATING, _SETTLED, "no environment: as is"),
    Transition(State.TRAINING, State.EVALUATING, _JOB_DONE, "last job settled"),
    Transition(State.EVALUATING, State.COMPLETED, ("RolloutCompleted",), "last evaluation in"),
    *(
        Transition(source, State.FAILED, on, "the agent was deleted")
        for source, on in (
            (State.DIAGNOSING, ("CapabilitiesIdentified",)),
            (State.SYNTHESIZING, _SETTLED),
            (State.TRAINING, _JOB_DONE),
        )
    ),
    *(
        Transition(source, State.FAILED, (STALL, CANCEL), "stalled, or cancelled")
        for source in ACTIVE
    ),
)


class IllegalTransition(RuntimeError):
    """A handler tried a step `TRANSITIONS` does not list: a bug in the evaluator."""


def allowed(source: State | None, target: State, on: str) -> bool:
    return any(t.source == source and t.target == target and on in t.on for t in TRANSITIONS)


def move(cycle: Cycle, target: State, on: str) -> None:
    """Set the cycle's state to `target`, refusing a step the table does not list."""
    source = State(cycle.state)
    if not allowed(source, target, on):
        raise IllegalTransition(f"cycle {cycle.id}: {source} -> {target} on {on} is not a step")
    cycle.state = target


def mermaid() -> str:
    """The state diagram of `TRANSITIONS` (Mermaid), as docs/architecture.md shows it."""
    lines = ["stateDiagram-v2"]
    for t in TRANSITIONS:
        source = "[*]" if t.source is None else str(t.source)
        lines.append(f"    {source} --> {t.target}: {' / '.join(t.on)}<br/>({t.when})")
    lines += [f"    {state} --> [*]" for state in ENDED]
    return "\n".join(lines) + "\n"
