"""Where a model server (serve-model, the gate in front of vLLM) loads an adapter from: only
beneath the artifact store, and a path outside it is refused before anything beneath it is
looked at (session 33's review: the walk came first, so the time of the 403 told what lay
outside the store, 8 s for a virtualenv against none for a missing path, and `/` had a
thread walk the whole disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.serving.access import ModelAccess, OutsideStore


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory whose files were listed."""
    seen: list[Path] = []
    real = Path.rglob

    def rglob(self: Path, pattern: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        return real(self, pattern, *args, **kwargs)

    monkeypatch.setattr(Path, "rglob", rglob)
    return seen


async def test_only_an_adapter_beneath_the_store_is_walked(
    tmp_path: Path, walked: list[Path]
) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    (store / "acme" / "a1").mkdir(parents=True)
    (store / "acme" / "a1" / "adapter_model.safetensors").write_bytes(b"w")
    (outside / "deep" / "er").mkdir(parents=True)
    access = ModelAccess(adapter_dirs=[store])
    for given in (outside, outside / "deep", "/", store, store / ".."):
        with pytest.raises(OutsideStore):
            await access.adapter_path(str(given))
    assert walked == []
    adapter = (store / "acme" / "a1").resolve()
    assert await access.adapter_path(str(store / "acme" / "a1")) == adapter
    assert walked == [adapter]


async def test_a_link_loop_anywhere_is_refused_as_outside(tmp_path: Path) -> None:
    """A loop raised a RuntimeError from Python 3.11's `resolve`, which was a 500."""
    store = tmp_path / "store"
    (store / "acme" / "a1").mkdir(parents=True)
    (store / "acme" / "a1" / "weights").symlink_to(store / "acme" / "a1" / "weights")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    access = ModelAccess(adapter_dirs=[store])
    for given in (tmp_path / "loop", tmp_path / "loop" / "x", store / "acme" / "a1"):
        with pytest.raises(OutsideStore):
            await access.adapter_path(str(given))
