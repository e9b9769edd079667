"""Capabilities and their labels: what a labeller says about one capability on one trajectory.

A label is `PRESENT` (the trajectory shows the capability), `LACKING` (it needed the
capability and did not show it) or `NA` (the capability does not apply to it). A `Capability`
is a snake_case name plus a definition precise enough for a judge to give that label from
one trajectory; deterministic capabilities also carry the rule that gives it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast, get_args

from services.contrast.trajectory import TrajectoryView

Label = Literal["NA", "PRESENT", "LACKING"]
LABELS: frozenset[str] = frozenset(get_args(Label))
Rule = Callable[[TrajectoryView], Label]

_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
_WORD = re.compile(r"[^\W\d_]{2,}")
MIN_DEFINITION_WORDS = 3
"""A definition says what PRESENT and LACKING mean; a placeholder ("...") is none."""
MAX_NAME = 100
"""The store's `capabilities.name` column width."""


@dataclass(frozen=True)
class Capability:
    name: str
    """snake_case, e.g. `recover_from_tool_errors`; unique within one contrast."""
    definition: str
    """What PRESENT, LACKING and NA mean on one trajectory."""
    rule: Rule | None = None
    """The deterministic labelling function; None for capabilities only a judge can label."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or len(self.name) > MAX_NAME:
            raise ValueError(
                f"capability name {self.name!r} must be snake_case "
                f"(lowercase words joined by '_', at most {MAX_NAME} characters)"
            )
        if len(_WORD.findall(self.definition)) < MIN_DEFINITION_WORDS:
            raise ValueError(
                f"capability {self.name!r} needs a definition in words (at least "
                f"{MIN_DEFINITION_WORDS}), not {self.definition[:80]!r}"
            )


class Labeller(Protocol):
    """Labels one capability on one trajectory, in one labelling run.

    `run` numbers the repeated labelings (0..R-1, then R for the full-set labelling); a
    stochastic labeller (an LLM judge) may use it as its sampling seed, a deterministic one
    ignores it. Within one run a trajectory is labelled once per capability."""

    def label(self, capability: Capability, trajectory: TrajectoryView, run: int) -> Label: ...


def check_label(value: object, capability: Capability, trajectory: TrajectoryView) -> Label:
    """`value` if it is a label, else a ValueError naming who produced it."""
    if not isinstance(value, str) or value not in LABELS:
        raise ValueError(
            f"labeller gave {value!r} for capability {capability.name!r} on trajectory "
            f"{trajectory.id}; expected one of {sorted(LABELS)}"
        )
    return cast(Label, value)
