"""A tau2 episode's Score: tau2's own evaluator (evaluation type ALL) on its message history.

The reward is tau2's. An episode that did not end the way tau2 accepts (a step or error limit,
an empty message, or not ended at all when scored) gets 0, as tau2 gives it; its breakdown
still shows which of the task's checks the history would have passed, for diagnosis.
"""

from __future__ import annotations

import uuid
from copy import deepcopy
from typing import Any

from shared.envs.protocol import Score
from shared.envs.tau2.tasks import write_tools
from shared.logging import get_logger

log = get_logger(__name__)


def evaluate(domain: str, task: Any, trajectory: list[Any], termination: Any, errors: int) -> Score:
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.metrics.agent_metrics import is_successful
    from tau2.utils.utils import get_now

    accepted = {TerminationReason.AGENT_STOP, TerminationReason.USER_STOP}
    ended = termination if termination is not None else TerminationReason.MAX_STEPS
    messages = deepcopy(trajectory)
    for i, message in enumerate(messages):
        message.turn_idx = i
    now = get_now()
    run = SimulationRun(
        id=str(uuid.uuid4()),
        task_id=task.id,
        start_time=now,
        end_time=now,
        duration=0.0,
        # Evaluated as if it had ended normally, so the breakdown says what it achieved; the
        # reward below is still tau2's for the way it really ended.
        termination_reason=ended if ended in accepted else TerminationReason.USER_STOP,
        messages=messages,
    )
    try:
        info = evaluate_simulation(
            simulation=run,
            task=task,
            evaluation_type=EvaluationType.ALL,
            solo_mode=False,
            domain=domain,
        )
    except Exception as exc:  # noqa: BLE001  scoring is a boundary: a history tau2 cannot replay scores 0
        log.warning("tau2 evaluator failed", task=task.id, error=repr(exc)[:500])
        return Score(reward=0.0, success=False, notes=[f"tau2's evaluator failed: {exc!r}"[:1000]])
    breakdown = {
        _key(basis): float(value) for basis, value in (info.reward_breakdown or {}).items()
    }
    notes = _notes(info, write_tools(domain))
    reward = float(info.reward)
    if ended not in accepted:
        why = "not ended when scored" if termination is None else f"ended as {ended.value}"
        notes.insert(0, f"tau2 gives 0: the episode {why} ({errors} tool errors)")
        reward = 0.0
    return Score(
        reward=reward,
        success=bool(is_successful(reward)),
        breakdown=breakdown,
        notes=notes,
    )


def _key(basis: Any) -> str:
    """`RewardType.DB` -> `db`, `RewardType.ENV_ASSERTION` -> `env_assertion`."""
    return str(getattr(basis, "value", basis)).lower()


def _notes(info: Any, writes: frozenset[str]) -> list[str]:
    """Why the scored checks that failed failed, in tau2's terms; a database that differs is
    explained by the gold state-changing actions that were not taken."""
    from tau2.data_model.tasks import RewardType

    basis = set(info.reward_basis or [])
    notes: list[str] = []
    if RewardType.DB in basis and info.db_check is not None and not info.db_check.db_match:
        notes.append("database differs from the one the gold actions produce")
    for check in info.action_checks or []:
        action = check.action
        if not check.action_match and (RewardType.ACTION in basis or action.name in writes):
            notes.append(f"gold action not taken: {action.name}({_args(action.arguments)})")
    for check in info.communicate_checks or []:
        if not check.met:
            notes.append(f"not communicated to the user: {check.info!r}")
    for check in info.env_assertions or []:
        if not check.met:
            assertion = check.env_assertion
            call = f"{assertion.func_name}({_args(assertion.arguments)})"
            notes.append(f"environment assertion failed: {assertion.message or call}")
    return notes


def _args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())[:300]
