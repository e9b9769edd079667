"""The spec of a derived environment: a capability's training environment built from the
target's own train tasks, played over the target's real tools in fresh seeded worlds.

retrace's procedural scenario families are written for the toolbox. For any other target with a
synchronous reset (a plug-in such as examples/hotel_desk), a capability is isolated by *task
selection* instead: the target train tasks the capability was found missing on, each replayed in
`seeds` different seeded worlds, graded by the target's own reward blended with a check of the
capability itself (`shared/envs/derived/checks.py`), with hints for guided rollouts. The first
`seeds - test_seeds` worlds of each task are train tasks, the rest the held-out test tasks: a
held-out gain here means new worlds of the same requests, not new requests.

A target whose episodes start asynchronously (an HTTP environment, MCP tools) cannot be
replayed inside a training step, and its tools may be another process's to call. Its derived
spec carries a snapshot of each chosen task's opening instead (`simulated`: the system prompt,
the exact tool schemas and the first messages, as the target served them), and the tools'
results are simulated from the episode's seed (`shared/envs/derived/simulated.py`); the reward
is then the capability check alone, and every score says the tools were simulated.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from shared.envs.protocol import Message
from shared.envs.synthetic.spec import Capability, InvalidSpecError
from shared.errors import UNDECODABLE

DERIVED: Literal["derived"] = "derived"


class SimulatedTask(msgspec.Struct, kw_only=True, frozen=True):
    """A target task's opening as the target served it, for a simulated replay."""

    task_id: str
    kind: str
    system_prompt: str
    tools: list[dict[str, Any]]
    """OpenAI tool schemas, exactly the target's."""
    messages: list[Message]


class DerivedSpec(msgspec.Struct, kw_only=True, frozen=True):
    kind: Literal["derived"] = DERIVED
    """Tells a derived spec from a procedural one where both are stored."""
    spec_version: int = 1
    name: str
    """Slug; the environment is `synthetic/<name>`."""
    target: str
    """The target environment's reference; its tools and reward are used as they are."""
    capability: Capability
    task_ids: list[str]
    """Target train tasks the environment replays."""
    check: str | None = None
    """The capability check blended into the reward (None: the target's reward alone)."""
    check_weight: float = 0.5
    seeds: int = 8
    test_seeds: int = 2
    hints: list[str] = msgspec.field(default_factory=list)
    hint_share: float = 0.0
    revision: int = 0
    simulated: list[SimulatedTask] | None = None
    """Set for a target replayed from snapshots with simulated tool results (see above)."""


def decode_derived(raw: bytes | str) -> DerivedSpec:
    try:
        spec = msgspec.json.decode(raw, type=DerivedSpec)
    except UNDECODABLE as exc:
        raise InvalidSpecError(f"malformed derived spec: {exc}") from exc
    problems = []
    if not spec.task_ids:
        problems.append("no target task to replay")
    if not 0 < spec.test_seeds < spec.seeds:
        problems.append("test_seeds must be between 1 and seeds - 1")
    if not 0.0 <= spec.check_weight <= 1.0:
        problems.append("check_weight must be in [0, 1]")
    if spec.simulated is not None:
        if spec.check is None:
            problems.append("simulated tools need a capability check to grade with")
        if {t.task_id for t in spec.simulated} != set(spec.task_ids):
            problems.append("simulated tasks must be exactly task_ids")
    if problems:
        raise InvalidSpecError(f"derived spec {spec.name!r}: " + "; ".join(problems))
    return spec


def is_derived(raw: object) -> bool:
    """Whether stored spec data (a dict) is a derived spec."""
    return isinstance(raw, dict) and raw.get("kind") == DERIVED
