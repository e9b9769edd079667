"""A spec's task set: one generated scenario per task, stable ids, a fixed 80/20 split.

`build_scenario(spec, seed)` runs the spec's family generator and returns the task's data,
self-contained (the offered tools and the checks travel with it, so a stored task rebuilds
its episode without the spec):

    family, revision, seed    where it came from
    request, user_replies     the opening message and the scripted user's answers
    world, faults             the toolbox fixture and the injected transient failures
    tools                     the offered tool names (needed + drawn distractors)
    checks                    the spec's weighted checks, as data
    expected, values          what `called_tool` and `reply_mentions` compare with
    excused, withheld         errors the scenario provokes; whether a detail was held back
    hint                      guidance for hinted rollouts (hints.py), never the solution
    forbidden, reference      toolbox forbidden actions; the reference solution (reward 1)

Task `<name>-<nnnn>` uses a seed derived from its id; a seed whose request, replies and
expected values repeat an earlier task's is redrawn. The split comes in blocks of ten: the
eight ids with the lowest hash are train, the other two test.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import msgspec

from shared.envs.protocol import Split, TaskSpec
from shared.envs.synthetic.families import family_of
from shared.envs.synthetic.hints import task_hint
from shared.envs.synthetic.scenario import Scenario
from shared.envs.synthetic.spec import SyntheticSpec
from shared.envs.synthetic.target import tool_order
from shared.envs.toolbox.templates.error_recovery import TRANSIENT

BLOCK = 10
TRAIN_PER_BLOCK = 8
ATTEMPTS = 50
"""Redraws allowed for a task whose scenario repeats an earlier one."""


class GeneratorError(RuntimeError):
    """A family generator broke its declaration or ran out of distinct scenarios."""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(name: str, index: int) -> Split:
    start = index - index % BLOCK
    block = [f"{name}-{i:04d}" for i in range(start, start + BLOCK)]
    ranked = sorted(block, key=lambda task_id: _digest(f"synthetic-split:{task_id}"))
    return "train" if ranked.index(f"{name}-{index:04d}") < TRAIN_PER_BLOCK else "test"


def build_scenario(spec: SyntheticSpec, seed: int) -> dict[str, Any]:
    """The data of the task the spec's family generates from `seed`."""
    family = family_of(spec)
    if family is None:
        raise GeneratorError(f"unknown scenario {spec.scenario!r}")
    knobs = spec.knobs
    scenario = Scenario.start(family.name, knobs, seed)
    # the common draws use their own stream, so they never shift the family's
    common = random.Random(f"synthetic-common:{family.name}:{seed}")
    if common.random() < knobs.transient_failure_rate:
        fault = {"tool": family.action, "times": knobs.failure_repeats}
        scenario.b.faults.append({**fault, "error": common.choice(TRANSIENT)})
    pool = spec.offered("distractor")
    drawn = set(common.sample(pool, min(knobs.distractor_tools, len(pool))))
    offered = set(spec.offered("needed")) | drawn
    family.generate(scenario)
    problems = family.produced_problems(scenario)
    if problems:
        raise GeneratorError(f"{family.name} (seed {seed}): {'; '.join(problems)}")
    data = scenario.b.data()
    data.pop("milestones")  # the toolbox's own grading; synthetic checks replace it
    task = {
        **data,
        "family": family.name,
        "revision": spec.revision,
        "tools": [name for name in tool_order() if name in offered],
        "checks": msgspec.to_builtins(spec.checks),
        "expected": scenario.expected,
        "values": scenario.values,
        "excused": scenario.excused,
        "withheld": scenario.withheld,
    }
    task["hint"] = task_hint(spec, task)
    return task


def _signature(data: dict[str, Any]) -> str:
    keys = ("request", "user_replies", "expected", "values")
    return json.dumps([data[key] for key in keys], sort_keys=True)


def generate_tasks(spec: SyntheticSpec) -> list[TaskSpec]:
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for index in range(spec.task_count):
        task_id = f"{spec.name}-{index:04d}"
        for attempt in range(ATTEMPTS):
            data = build_scenario(spec, _digest(f"{task_id}:{attempt}") % 2**31)
            if _signature(data) not in seen:
                break
        else:
            raise GeneratorError(f"{task_id}: {spec.scenario} ran out of distinct scenarios")
        seen.add(_signature(data))
        split = split_of(spec.name, index)
        tasks.append(TaskSpec(id=task_id, kind=spec.scenario, split=split, data=data))
    return tasks
