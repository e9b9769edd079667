"""The synthetic-environment spec: versioned data (never code) that our interpreter runs.

A spec names the capability it trains, the target whose tools it reuses, the tools it offers
(each with the target's exact schema, as needed or as a distractor), one procedural scenario
family, the difficulty knobs, and the weighted reward checks. Everything is a msgspec Struct,
so a spec travels on the bus and sits in Postgres as JSON.

Fields only grow (new ones last, with defaults); an incompatible change bumps `spec_version`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from shared.errors import UNDECODABLE, PermanentError

SPEC_VERSION = 1
"""The spec version this interpreter runs."""

ToolRole = Literal["needed", "distractor"]
SlotKind = Literal["contact", "choice", "integer", "clock"]
MatchKind = Literal["eq", "has", "phone", "clock", "number"]


class InvalidSpecError(PermanentError):
    """A spec that fails validation; the message lists every problem."""


class Capability(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    """Contrast's label, e.g. `ask_for_missing_information`."""
    definition: str = ""
    """What having the capability means, in words (from the contrast stage)."""


class ToolRef(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    """A tool of the target, by name."""
    role: ToolRole = "needed"
    """`needed`: the scenario's reference uses it; `distractor`: offered only to tempt."""
    schema: dict[str, Any] = msgspec.field(default_factory=dict)
    """The target's OpenAI schema for the tool, verbatim (validation compares them)."""


class Knobs(msgspec.Struct, kw_only=True, frozen=True):
    """Difficulty knobs (defaults are the easiest setting; families bring their own).

    Every family reads `GENERIC_KNOBS`; the others only where the family's module says so.
    """

    distractors: int = 0
    """Look-alike entities beside the target: contacts, alarms, reminders or events."""
    distractor_tools: int = 0
    """How many of the spec's distractor tools each task offers (drawn per task)."""
    withhold_rate: float = 0.0
    """Share of tasks whose request leaves out a detail the agent must ask for."""
    invalid_format_rate: float = 0.0
    """Share of tasks where the user says a value in a form the tool rejects as-is."""
    transient_failure_rate: float = 0.0
    """Share of tasks whose action tool fails transiently before it works."""
    failure_repeats: int = 1
    """How many times in a row an injected transient failure happens."""


KNOB_BOUNDS: dict[str, tuple[float, float, float]] = {
    "distractors": (0, 8, 2),
    "distractor_tools": (0, 8, 1),
    "withhold_rate": (0.0, 1.0, 0.25),
    "invalid_format_rate": (0.0, 1.0, 0.25),
    "transient_failure_rate": (0.0, 1.0, 0.25),
    "failure_repeats": (1, 3, 1),
}
"""knob -> (lowest, highest, one calibration step); a higher value is always harder."""

GENERIC_KNOBS = frozenset({"distractor_tools", "transient_failure_rate", "failure_repeats"})
"""Knobs every family reads (the common scenario code applies them)."""


class CheckSpec(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One weighted sub-check; which fields it needs depends on `kind` (see checks.py)."""

    kind: str
    """One of `CHECK_KINDS`, e.g. `called_tool`."""
    weight: float
    """Share of the reward; a spec's weights sum to 1."""
    name: str | None = None
    """Label in the score breakdown; defaults to `kind` or `kind:tool`."""
    tool: str | None = None
    """The tool the check is about (`called_tool`, `retried_after_error`, `looked_up_first`)."""
    keys: list[str] = msgspec.field(default_factory=list)
    """`called_tool`: the arguments that must carry the scenario's expected values."""
    value: str | None = None
    """`reply_mentions`: the scenario value the reply must name, e.g. `result`."""
    before: str | None = None
    """`looked_up_first`: the action tool the lookup must precede."""

    @property
    def label(self) -> str:
        return self.name or (f"{self.kind}:{self.tool}" if self.tool else self.kind)


class Slot(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    kind: SlotKind
    options: list[str] = msgspec.field(default_factory=list)
    """`choice`: the values drawn from (at least two, so seeds differ)."""
    low: int = 0
    high: int = 0
    """`integer`: drawn from [low, high]."""
    relation: str | None = None
    """`contact`: the person's relation to the user (e.g. `sister`); drawn when unset."""


class Call(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    tool: str
    arguments: dict[str, Any]
    """Argument values; strings may hold placeholders."""
    expect: dict[str, MatchKind] = msgspec.field(default_factory=dict)
    """Arguments a correct call must match, and how: `eq` same text, `has` every word,
    `phone` same digits, `clock` same HH:MM, `number` same number."""


class ScenarioTemplate(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A scenario family as data (interpreted by template.py): slots drawn per seed, and
    texts and arguments that name them as `{slot}` or `{slot.field}`."""

    slots: dict[str, Slot]
    requests: list[str]
    """Phrasings of the user's request; one is drawn per task."""
    calls: list[Call]
    """The reference solution's tool calls, in order; the last is the action a transient
    failure hits."""
    reply: str
    """The reference's closing message to the user."""
    values: dict[str, str] = msgspec.field(default_factory=dict)
    """name -> text the final reply should contain (`reply_mentions` checks name one)."""
    hints: list[str] = msgspec.field(default_factory=list)
    """Soft guidance for hinted rollouts (what to attend to, never the solution's values)."""


class SyntheticSpec(msgspec.Struct, kw_only=True, frozen=True):
    spec_version: int = SPEC_VERSION
    name: str
    """Slug naming the environment; task ids are `<name>-<nnnn>`."""
    target: str = "toolbox"
    """The environment whose tool schemas and implementations are reused."""
    capability: Capability
    scenario: str
    """The procedural scenario family (see `families.FAMILIES`)."""
    tools: list[ToolRef]
    knobs: Knobs = msgspec.field(default_factory=Knobs)
    checks: list[CheckSpec]
    task_count: int = 200
    """How many tasks `tasks()` lists (split 80/20 train/test)."""
    revision: int = 0
    """Bumped by each calibration adjustment."""
    template: ScenarioTemplate | None = None
    """The scenario as data when `scenario` is `template` (see template.py); else unset."""
    hint_share: float = 0.0
    """Share of each GRPO group (and calibration group) whose rollouts see the task's hint;
    calibration tunes it (see calibration.py), training uses the accepted value."""

    def offered(self, role: ToolRole | None = None) -> list[str]:
        """Names of the spec's tools, optionally only those of one role, in spec order."""
        return [t.name for t in self.tools if role is None or t.role == role]


def encode(spec: SyntheticSpec) -> bytes:
    return msgspec.json.encode(spec)


def decode(raw: bytes | str) -> SyntheticSpec:
    """A spec from JSON; a wrong shape is an `InvalidSpecError`."""
    try:
        return msgspec.json.decode(raw, type=SyntheticSpec)
    except UNDECODABLE as exc:
        raise InvalidSpecError(f"malformed spec: {exc}") from exc
