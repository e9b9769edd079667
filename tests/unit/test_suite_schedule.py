"""The test run's own schedule (README: `pytest -n 4 --dist loadgroup`): the tests that load a
real model run on one xdist worker, one after another, the whole cycle with a model (the
promotion e2e) on another, while the other workers run the rest.
With pytest 9.2 xdist's groups were silently ignored (pytest-dev/pytest-xdist#1386): the model
tests were dealt to every worker and shared the 2 cores again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="the schedule is pytest-xdist's")

ROOT = Path(__file__).resolve().parents[2]
SUITE = {
    "conftest.py": "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n",
    "pytest.ini": "[pytest]\nmarkers =\n    model: loads a real model\n    e2e: whole\n",
    "test_cycle.py": (
        "import pytest\n\n"
        + "".join(
            f"@pytest.mark.e2e\n@pytest.mark.model\ndef test_cycle_model_{i}():\n    pass\n\n"
            for i in range(2)
        )
    ),
    **{
        f"test_{name}.py": (
            "import pytest\n\n"
            + "".join(
                f"@pytest.mark.model\ndef test_{name}_model_{i}():\n    pass\n\n"
                f"def test_{name}_plain_{i}():\n    pass\n\n"
                for i in range(3)
            )
        )
        for name in ("a", "b")
    },
}


def test_model_tests_share_a_worker_and_the_whole_cycle_has_its_own(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    workers: dict[str, set[str]] = {"model": set(), "plain": set(), "cycle": set()}
    for worker, name, kind in re.findall(
        r"\[(gw\d+)\].*PASSED test_(\w+)\.py::test_\w+_(model|plain)_", ran.stdout
    ):
        workers["cycle" if name == "cycle" else kind].add(worker)
    assert len(re.findall(r"PASSED", ran.stdout)) == 14, ran.stdout
    assert len(workers["model"]) == 1, ran.stdout  # all six on one worker
    assert len(workers["cycle"]) == 1, ran.stdout  # the whole cycle's on one worker
    assert workers["cycle"] != workers["model"], ran.stdout  # beside the other model tests
    assert workers["plain"] - workers["model"], ran.stdout  # the rest beside them
