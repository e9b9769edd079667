"""Grade a toolbox episode: weighted milestones for partial credit, forbidden actions zero it.

reward = (sum of the weights of the milestones met) / (sum of all weights), unless a forbidden
action happened, in which case reward = 0. success = every milestone met and nothing forbidden.

`breakdown` gives each check's contribution and always sums to the reward: a met milestone
contributes weight / total, a missed one 0; a forbidden action that happened contributes minus
the milestone total (split evenly when several happened), one that did not, 0.
"""

from __future__ import annotations

from typing import Any

from shared.envs.protocol import Score
from shared.envs.toolbox.checks import CHECKS, Trace


def score(data: dict[str, Any], trace: Trace) -> Score:
    milestones: list[dict[str, Any]] = data["milestones"]
    forbidden: list[dict[str, Any]] = data.get("forbidden", [])
    total = sum(float(m["weight"]) for m in milestones) or 1.0
    breakdown: dict[str, float] = {}
    notes: list[str] = []
    for milestone in milestones:
        met = _holds(milestone, trace)
        breakdown[milestone["name"]] = float(milestone["weight"]) / total if met else 0.0
        if not met:
            notes.append(f"missed: {milestone['name']}")
    earned = sum(breakdown.values())
    broken = [rule for rule in forbidden if _holds(rule, trace)]
    for rule in forbidden:
        key = f"forbidden:{rule['name']}"
        breakdown[key] = -earned / len(broken) if rule in broken else 0.0
    for rule in broken:
        notes.append(f"forbidden: {rule['name']}")
    reward = 0.0 if broken else round(earned, 6)
    success = not broken and all(breakdown[m["name"]] > 0 for m in milestones)
    return Score(reward=reward, success=success, breakdown=breakdown, notes=notes)


def _holds(check: dict[str, Any], trace: Trace) -> bool:
    return CHECKS[check["check"]](trace, **check.get("args", {}))
