"""A routing pack is opened only whole and as written: every defect a clear ConfigError."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numpy.lib.format import write_array_header_1_0

from shared import embeddings
from shared.cli.routing import routing_pack
from shared.errors import ConfigError
from shared.routing import pack
from shared.routing.pack import MANIFEST, TABLE, TOKENIZER, open_pack


def write_pack(path: Path, table: Any = None, **manifest: Any) -> Path:
    """A small pack (a 4 x 3 table) with any manifest field overridden."""
    path.mkdir(parents=True, exist_ok=True)
    table = np.arange(12, dtype=np.float32).reshape(4, 3) if table is None else table
    np.save(path / TABLE, table)
    (path / TOKENIZER).write_text("{}")
    fields = {
        "format": 1,
        "teacher": embeddings.PACKAGE,
        "teacher_version": "0.1.0",
        "rows": 4,
        "dim": 3,
        "table_sha256": hashlib.sha256((path / TABLE).read_bytes()).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(b"{}").hexdigest(),
    } | manifest
    (path / MANIFEST).write_text(json.dumps(fields))
    return path


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    out = io.BytesIO()
    write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def test_a_whole_pack_opens_with_its_manifest(tmp_path: Path) -> None:
    opened = open_pack(write_pack(tmp_path / "p"))
    assert opened.manifest.rows == 4 and opened.manifest.teacher_version == "0.1.0"
    assert opened.table == tmp_path / "p" / TABLE and opened.tokenizer.name == TOKENIZER


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda p: (p / MANIFEST).unlink(), "no pack.json"),
        (lambda p: (p / MANIFEST).write_text("{"), "not a routing pack's manifest"),
        (lambda p: (p / MANIFEST).write_text("[]"), "not a routing pack's manifest"),
        (lambda p: (p / TABLE).unlink(), "static-table.npy is missing"),
        (lambda p: (p / TOKENIZER).unlink(), "tokenizer.json is missing"),
        (lambda p: (p / TABLE).write_bytes(b"not numpy"), "is not a table"),
        (lambda p: write_pack(p, rows=5), "the manifest says (5, 3)"),
        (lambda p: write_pack(p, np.zeros((4, 3), np.float64)), "(4, 3) <f8"),
        (lambda p: write_pack(p, teacher="other-model"), "built from 'other-model'"),
        (lambda p: write_pack(p, format=2), "not a routing pack's manifest"),
        (lambda p: write_pack(p, extra=1), "not a routing pack's manifest"),
        (lambda p: write_pack(p, table_sha256="0" * 64), "static-table.npy is not the file"),
        (lambda p: (p / TOKENIZER).write_text("{ }"), "tokenizer.json is not the file"),
        (lambda p: write_pack(p, table_sha256="0" * 63), "not a routing pack's manifest"),
        (lambda p: write_pack(p, rows=0), "not a routing pack's manifest"),
        (lambda p: ((p / MANIFEST).unlink(), (p / MANIFEST).mkdir()), "cannot read pack.json"),
        (lambda p: ((p / TABLE).unlink(), (p / TABLE).mkdir()), "static-table.npy is missing"),
    ],
)
def test_a_spoilt_pack_is_refused_saying_what_is_wrong(
    tmp_path: Path, spoil: Any, says: str
) -> None:
    path = write_pack(tmp_path / "p")
    spoil(path)
    with pytest.raises(ConfigError, match=r"routing pack .*RETRACE_ROUTING_PACK") as caught:
        open_pack(path)
    assert says in str(caught.value)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        open_pack(tmp_path / "absent")


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
@example(b"PK\x03\x04" + b"\0" * 40)  # a zip archive: numpy reads it as an .npz
@example(npy_header((10**30, 3)))  # past what a C long holds (numpy's mapping overflows)
@example(npy_header((4, 3)))  # a header without its data
@example(npy_header((4, 3), "|O"))  # objects: pickles
@example(b"\x93NUMPY\x03\x00" + b"\0" * 20)  # a format numpy does not write
def test_any_bytes_as_the_table_are_a_config_error_or_a_table(
    tmp_path_factory: Any, raw: bytes
) -> None:
    path = write_pack(tmp_path_factory.mktemp("p"))
    (path / TABLE).write_bytes(raw)
    with pytest.raises(ConfigError):
        open_pack(path)  # the SHA-256 never matches: but the bytes must be read without a crash


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.dictionaries(st.text(max_size=12), st.integers())))
def test_any_manifest_that_is_not_one_is_a_config_error(tmp_path_factory: Any, raw: Any) -> None:
    path = write_pack(tmp_path_factory.mktemp("p"))
    (path / MANIFEST).write_bytes(raw if isinstance(raw, bytes) else json.dumps(raw).encode())
    with pytest.raises(ConfigError, match=r"pack\.json"):
        open_pack(path)


def test_the_environment_names_the_pack_and_a_bad_one_stops_routing_s_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(pack.ENV, raising=False)
    assert pack.configured() is None
    monkeypatch.setenv(pack.ENV, str(write_pack(tmp_path / "good")))
    assert pack.configured() == open_pack(tmp_path / "good")
    monkeypatch.setenv(pack.ENV, str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="no such directory"):
        pack.configured()


def test_a_bad_pack_stops_routing_s_start_model_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_pack(tmp_path / "p", table_sha256="0" * 64)
    monkeypatch.setenv(pack.ENV, str(path))
    for kind in ("cascade-learned", "minilm"):
        with pytest.raises(ConfigError, match=r"static-table\.npy is not the file"):
            embeddings.routable(kind)


def test_a_pack_is_not_written_over_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds other files \(notes.txt\)"):
        pack.build(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_cli_checks_a_pack_and_names_a_bad_one(tmp_path: Path) -> None:
    good = CliRunner().invoke(routing_pack, ["check", str(write_pack(tmp_path / "p"))])
    assert good.exit_code == 0, good.output
    assert "routing pack checked" in good.output and "table 4 x 3" in good.output
    (tmp_path / "p" / TOKENIZER).unlink()
    bad = CliRunner().invoke(routing_pack, ["check", str(tmp_path / "p")])
    assert bad.exit_code == 1 and "tokenizer.json is missing" in bad.output


@pytest.mark.parametrize("service", ["router", "evaluator"])
def test_a_service_named_a_bad_pack_does_not_start_and_says_why(
    tmp_path: Path, service: str
) -> None:
    """The real service process: refused at start with the pack's defect, exit code 2 (a
    rejected configuration), not a traceback after it began to serve."""
    env = {**os.environ, pack.ENV: str(tmp_path / "absent"), "RETRACE_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-m", f"services.{service}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-2000:]
    assert "configuration rejected" in said and "no such directory" in said
    assert "Traceback" not in said
