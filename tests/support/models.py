"""Packaged models for tests: skipped only when their packages are not installed; any other
failure to load one (a checksum, a conversion) is a test failure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shared.serving.model_files import resolve_model
from shared.serving.packaged import packaged


def packaged_or_skip(alias: str) -> Path:
    """The converted model directory of a packaged model; a skip when it is not installed."""
    model = packaged(alias)
    assert model is not None, f"{alias} is not in the catalogue"
    missing = [module for module, _ in model.parts if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"{model.name} is not installed: {model.install}")
    return resolve_model(alias)
