"""Hints: soft guidance an episode may carry, shown to some training rollouts only.

An episode (a synthetic environment's) may have a `hint` attribute: guidance that points at the
capability the task trains without giving its solution. In a GRPO group a share of the rollouts
sees it appended to the system turn inside `<expert_guidance>` (the paper's hint injection);
before the gradient step their prompts are rebuilt without it, so the adapter learns to act
without the hint. Calibration rollouts are hinted the same way (`hinted_trials`).
"""

from __future__ import annotations

OPEN, CLOSE = "<expert_guidance>", "</expert_guidance>"


def hint_of(episode: object) -> str:
    """The episode's hint, or "" when it has none."""
    hint = getattr(episode, "hint", "")
    return hint.strip() if isinstance(hint, str) else ""


def with_guidance(system: str, hint: str) -> str:
    """The system turn with the hint appended as expert guidance (unchanged without a hint)."""
    if not hint:
        return system
    block = f"{OPEN}\n{hint}\n{CLOSE}"
    return f"{system}\n\n{block}" if system else block


def hinted_count(group_size: int, share: float) -> int:
    """How many rollouts of a group get the hint: `share` of them, rounded, never all when
    `share` < 1 (a group must keep unhinted rollouts to measure the policy on its own)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"hint share must be in [0, 1], got {share}")
    count = round(group_size * share)
    if share < 1.0:
        count = min(count, group_size - 1)
    return max(count, 1) if share > 0 and group_size > 1 else count


def hinted_trials(trials: int, share: float) -> frozenset[int]:
    """The trial indices (0-based) of a task's rollouts that get the hint: the first ones."""
    return frozenset(range(hinted_count(trials, share)))
