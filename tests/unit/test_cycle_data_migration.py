"""Migration 0004's converters between the flat cycle data and the shape by stage."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from services.evaluator.state import (
    CycleData,
    Diagnosis,
    Evaluation,
    Settlement,
    Synthesis,
    Training,
)
from shared.messages import CycleSettings

PATH = Path(__file__).parents[2] / "migrations" / "versions" / "0004_cycle_data_by_stage.py"


def _migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("m0004", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = _migration()
ids = st.uuids().map(str)
reasons = st.text(min_size=1, max_size=12)
settlements = st.one_of(
    ids.map(lambda e: Settlement(environment=e)), reasons.map(lambda r: Settlement(reason=r))
)


@st.composite
def evaluations(draw: st.DrawFn) -> Evaluation:
    requests = draw(st.dictionaries(st.sampled_from(["base", "adapter:a", "baseline:gepa"]), ids))
    route = draw(st.dictionaries(st.sampled_from(["base", "adapter:a"]), ids))
    every = [*requests.values(), *route.values()]
    done = draw(st.lists(st.sampled_from(every), unique=True)) if every else []
    return Evaluation(
        requests=requests,
        route_requests=route,
        done=sorted(done),
        adapters=draw(st.lists(ids, max_size=2)),
        production=draw(st.lists(ids, max_size=2)),
    )


@st.composite
def cycle_data(draw: st.DrawFn) -> CycleData:
    capabilities = draw(st.lists(ids, min_size=1, max_size=3, unique=True))
    settled = {c: draw(settlements) for c in capabilities if draw(st.booleans())}
    return CycleData(
        settings=CycleSettings(seed=draw(st.integers(0, 9))),
        diagnosis=Diagnosis(
            request_id=draw(ids), early=draw(st.dictionaries(ids, settlements, max_size=2))
        ),
        synthesis=draw(
            st.none()
            | st.just(
                Synthesis(
                    capabilities=capabilities,
                    reserves=draw(st.lists(ids, max_size=2)),
                    settled=settled,
                )
            )
        ),
        training=draw(
            st.none()
            | st.builds(
                Training,
                jobs=st.dictionaries(ids, st.none() | ids | st.just("failed")),
                baselines=st.dictionaries(ids, st.sampled_from(["gepa", "grpo_target"])),
                failures=st.dictionaries(ids, reasons),
            )
        ),
        evaluation=draw(st.none() | evaluations()),
        untrained=draw(st.none() | reasons),
        report=draw(st.none() | st.just({"verdict": {"promote": False}})),
    )


@given(cycle_data())
def test_by_stage_and_back_is_the_same_data(data: CycleData) -> None:
    stored = msgspec.to_builtins(data)
    old = M.flat(stored)
    assert isinstance(old.get("diagnosis"), str)
    back = M.by_stage(old)
    assert msgspec.convert(back, CycleData) == msgspec.convert(stored, CycleData)
    assert M.by_stage(stored) == stored  # already by stage: kept


def test_a_flat_cycle_of_every_stage_reads_by_stage() -> None:
    cap, env, job, adapter, r_base, r_route = (str(uuid.uuid4()) for _ in range(6))
    old: dict[str, Any] = {
        "settings": {"seed": 7},
        "diagnosis": str(uuid.uuid4()),
        "capabilities": [cap],
        "reserves": [],
        "environments": {cap: env},
        "synthesis_failures": {},
        "jobs": {job: adapter},
        "baseline_jobs": {},
        "evaluations": {"base": r_base, "route:base": r_route},
        "evaluated": ["route:base"],
        "adapters": [adapter],
        "production": [],
    }
    data = msgspec.convert(M.by_stage(old), CycleData)
    assert data.settings.seed == 7
    assert data.synthesis is not None and data.synthesis.ready() == {cap: env}
    assert data.training is not None and data.training.jobs == {job: adapter}
    assert data.evaluation is not None
    assert data.evaluation.requests == {"base": r_base}
    assert data.evaluation.route_requests == {"base": r_route}
    assert data.evaluation.done == [r_route] and not data.evaluation.complete()
