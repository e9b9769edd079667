"""The cycle's state machine: the table is enforced, and docs/architecture.md draws it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from shared import cycle as machine
from shared.cycle import State
from shared.messages import Contract
from shared.store.models import Cycle

DOC = Path(__file__).parents[2] / "docs" / "architecture.md"


def test_the_architecture_doc_draws_the_code_s_transition_table() -> None:
    text = DOC.read_text()
    drawn = machine.mermaid()
    assert f"```mermaid\n{drawn}```" in text, (
        "docs/architecture.md's cycle diagram is not the code's: paste "
        "`python -c 'from shared.cycle import mermaid; print(mermaid(), end=\"\")'`"
    )


def test_a_step_the_table_does_not_list_is_refused() -> None:
    cycle = Cycle(id=uuid.uuid4(), state=State.TRAINING)
    with pytest.raises(machine.IllegalTransition, match="training -> synthesizing"):
        machine.move(cycle, State.SYNTHESIZING, "EnvironmentReady")
    with pytest.raises(machine.IllegalTransition, match="on RolloutCompleted"):
        machine.move(cycle, State.EVALUATING, "RolloutCompleted")  # the right step, wrong event
    assert cycle.state == State.TRAINING
    machine.move(cycle, State.EVALUATING, "AdapterTrained")
    assert cycle.state == State.EVALUATING


def test_an_ended_cycle_never_moves_and_every_active_stage_can_stall() -> None:
    for state in machine.ENDED:
        assert not any(t.source == state for t in machine.TRANSITIONS)
    for state in machine.ACTIVE:
        assert machine.allowed(state, State.FAILED, machine.STALL)
        assert any(t.source == state and t.target != State.FAILED for t in machine.TRANSITIONS)


def test_every_event_the_table_names_is_a_contract() -> None:
    contracts = {c.__name__ for c in _subclasses(Contract)}
    named = {on for t in machine.TRANSITIONS for on in t.on} - {
        machine.STALL,
        machine.CANCEL,
        machine.REQUEST,
    }
    assert named <= contracts, named - contracts


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set(cls.__subclasses__())
    for sub in list(out):
        out |= _subclasses(sub)
    return out
