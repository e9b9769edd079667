"""What a scenario family is, and the builder its generator writes one task with.

A family is a declaration (the tools it needs, the expected arguments and reply values it
produces, the knobs it reads and the ones calibration tunes, its default checks and knobs)
plus one generator. The generator gets a `Scenario`: the toolbox's `TaskBuilder` (seeded
fixture helpers, request, scripted replies, reference solution, forbidden actions) and the
extras the synthetic checks read — expected call arguments, reply values, excused errors.

Generators draw only from `scenario.rng`, and draw every chance whether or not it is taken,
so the same seed always gives the same task and turning a knob changes only what it governs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.envs.synthetic.matchers import Matcher
from shared.envs.synthetic.spec import CheckSpec, Knobs
from shared.envs.toolbox.builder import TaskBuilder


@dataclass
class Scenario:
    family: str
    knobs: Knobs
    b: TaskBuilder
    expected: dict[str, dict[str, Matcher]]
    """tool -> argument -> matcher, for `called_tool`."""
    values: dict[str, Matcher]
    """name -> reply matcher, for `reply_mentions`."""
    excused: list[str]
    """Error texts the scenario itself provokes (not the agent's fault), e.g. a slot conflict."""
    withheld: bool = False
    """The request leaves out a detail the user gives only when asked."""
    _replayed: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, family: str, knobs: Knobs, seed: int) -> Scenario:
        return cls(family, knobs, TaskBuilder(family, seed), {}, {}, [])

    @property
    def rng(self) -> random.Random:
        return self.b.rng

    def chance(self, rate: float) -> bool:
        """True with probability `rate`; always draws, so rates do not shift later draws."""
        return self.rng.random() < rate

    def act(self, tool: str, /, **args: Any) -> None:
        """A reference call of `tool`, repeated through any transient failure injected on it."""
        for fault in self.b.faults:
            if fault["tool"] == tool and tool not in self._replayed:
                self._replayed.add(tool)
                for _ in range(int(fault["times"])):
                    self.b.call(tool, **args)
        self.b.call(tool, **args)

    def expect(self, tool: str, /, **matchers: Matcher) -> None:
        self.expected.setdefault(tool, {}).update(matchers)

    def value(self, name: str, matcher: Matcher) -> None:
        self.values[name] = matcher


@dataclass(frozen=True)
class Family:
    name: str
    capability: str
    """The capability it isolates (the default spec for that capability uses it)."""
    action: str
    """The tool an injected transient failure hits."""
    needed: tuple[str, ...]
    """Tools the reference solution uses."""
    distractors: tuple[str, ...]
    """Default pool of tempting tools the default spec offers beside them."""
    expects: dict[str, tuple[str, ...]]
    """tool -> the arguments the generator writes expected values for."""
    values: tuple[str, ...]
    """Names of the reply values the generator writes."""
    reads: frozenset[str]
    """Family-specific knobs it reads (beyond `GENERIC_KNOBS`)."""
    tunes: tuple[str, ...]
    """Knobs calibration moves, in order."""
    knobs: Knobs
    checks: tuple[CheckSpec, ...]
    generate: Callable[[Scenario], None]

    def produced_problems(self, scenario: Scenario) -> list[str]:
        """How a generated scenario departs from this declaration (a generator bug)."""
        problems = []
        made = {tool: tuple(sorted(args)) for tool, args in scenario.expected.items()}
        declared = {tool: tuple(sorted(keys)) for tool, keys in self.expects.items()}
        if made != declared:
            problems.append(f"expected arguments {made} differ from the declared {declared}")
        if sorted(scenario.values) != sorted(self.values):
            problems.append(f"reply values {sorted(scenario.values)} != {sorted(self.values)}")
        return problems
