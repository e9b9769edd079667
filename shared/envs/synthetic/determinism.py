"""Reject a generator that is not a pure function of its seed.

`check_deterministic(spec, seeds)` builds each seed's episode twice from scratch and compares
the system prompt, the offered tools, the opening messages, the world, and what replaying the
reference solution gives (every message and the score); it also requires that replay to score
1.0. Any difference is reported with the seed and the part that moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from shared.envs.protocol import TaskSpec
from shared.envs.synthetic.env import SyntheticEpisode
from shared.envs.synthetic.spec import SyntheticSpec
from shared.envs.synthetic.target import toolbox_schemas
from shared.envs.synthetic.tasks import build_scenario
from shared.envs.synthetic.validation import validate
from shared.envs.toolbox.env import reference_messages

PARTS = ("system prompt", "tools", "opening messages", "world", "reference replay")


def check_deterministic(spec: SyntheticSpec, seeds: Iterable[int]) -> list[str]:
    """Every way the spec's episodes differ between two builds of the same seed (empty: none)."""
    invalid = validate(spec, toolbox_schemas())
    if invalid:
        return [f"spec is invalid: {problem}" for problem in invalid]
    problems: list[str] = []
    for seed in seeds:
        try:
            first, second = _build(spec, seed), _build(spec, seed)
        # a generator may fail in any way at all; for this check that is a finding, not a crash
        except Exception as exc:  # noqa: BLE001
            problems.append(f"seed {seed}: building the episode failed: {exc!r}")
            continue
        moved = [part for part in PARTS if first[part] != second[part]]
        if moved:
            problems.append(
                f"seed {seed}: {', '.join(moved)} differ between two builds: the "
                f"{spec.scenario} generator is not deterministic for this seed (it must draw "
                "only from the scenario's seeded rng)"
            )
        reward = first["reference replay"]["score"]["reward"]
        if reward != 1.0:
            problems.append(f"seed {seed}: the reference solution scores {reward}, not 1.0")
    return problems


def _build(spec: SyntheticSpec, seed: int) -> dict[str, Any]:
    data = build_scenario(spec, seed)
    task = TaskSpec(id=f"{spec.name}-seed{seed}", kind=spec.scenario, split="train", data=data)
    episode = SyntheticEpisode(task, seed)
    opened = {
        "system prompt": episode.system_prompt,
        "tools": episode.tools,
        "opening messages": msgspec.to_builtins(episode.messages),
        "world": episode.world.snapshot(),
    }
    for message in reference_messages(task):
        episode.step(message)
    replay = {"transcript": episode.transcript, "score": episode.score()}
    return {**opened, "reference replay": msgspec.to_builtins(replay)}
