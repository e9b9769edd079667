"""Grade a synthetic episode: the weighted sum of the spec's checks, each shown in the breakdown.

reward = sum of the weights of the checks that hold (weights sum to 1), so a partly right
episode earns a partial reward; success = every check holds. `breakdown` maps each check's
label to its contribution (its weight, or 0) and sums to the reward.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.envs.protocol import Score
from shared.envs.synthetic.checks import CHECK_KINDS, Context
from shared.envs.synthetic.spec import CheckSpec
from shared.envs.toolbox.checks import Trace


def score(data: dict[str, Any], trace: Trace) -> Score:
    context = Context(trace, data)
    breakdown: dict[str, float] = {}
    notes: list[str] = []
    for check in msgspec.convert(data["checks"], list[CheckSpec]):
        held = CHECK_KINDS[check.kind](context, check)
        breakdown[check.label] = check.weight if held else 0.0
        if not held:
            notes.append(f"missed: {check.label}")
    reward = min(1.0, round(sum(breakdown.values()), 6))
    return Score(reward=reward, success=not notes, breakdown=breakdown, notes=notes)
