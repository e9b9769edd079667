"""Static token vectors learned to give all-MiniLM-L6-v2's sentence vectors.

Routing's static vectors (`shared.embeddings.StaticMiniLM`) are each vocabulary token through
MiniLM alone; a text is the mean of its tokens'. A training run (`benchmarks/learned_static.py`,
docs/benchmarks.md) moved the rows of the tokens in a corpus of requests so that a text's mean
points where MiniLM's own vector of the text does. The result routes a request that belongs to
no adapter far better than the plain table, at the plain table's cost (0.07 ms a query).

Only the learned rows ship (`TABLE`: their token ids, the rows in int8 with a scale each);
every other row is the installed MiniLM's static vector, so the file names the MiniLM package
version it was trained against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.errors import ConfigError

TABLE = Path(__file__).with_name("learned-static.npz")
FIELDS = ("ids", "rows", "scales", "teacher_version")


def load(base: Any, teacher_version: str, path: Path = TABLE) -> Any:
    """`base` (MiniLM's static table, vocabulary x dim) with the learned rows of `path` put
    in; a clear error where the file is absent, malformed or trained against another MiniLM
    than the one installed."""
    import numpy as np

    if not path.exists():
        raise ConfigError(f"the learned static table is missing: {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in FIELDS if k not in f.files]
            if missing:
                raise ConfigError(f"{path}: not a learned static table (no {', '.join(missing)})")
            ids, rows, scales, version = (f[k] for k in FIELDS)
    except ConfigError:
        raise
    except Exception as exc:  # numpy and zipfile raise many kinds for bad bytes
        # (a plain .npy is an array, not an archive: TypeError at `with`)
        raise ConfigError(f"{path}: not a learned static table ({exc!r})") from exc
    if not all(isinstance(a, np.ndarray) for a in (ids, rows, scales, version)):
        raise ConfigError(f"{path}: not a learned static table (a field is not an array)")
    if version.dtype.kind != "U" or version.shape != ():
        raise ConfigError(f"{path}: not a learned static table (teacher_version is not a name)")
    if str(version) != teacher_version:
        raise ConfigError(
            f"{path} was learned from all-MiniLM-L6-v2 {str(version)!r}, but "
            f"{teacher_version!r} is installed: use the `cascade-int8` embedder"
        )
    if (
        ids.ndim != 1
        or ids.dtype.kind not in "iu"
        or rows.shape != (len(ids), base.shape[1])
        or rows.dtype != np.int8
        or scales.shape != (len(ids),)
        or scales.dtype.kind != "f"
        or (len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(base)))
    ):
        raise ConfigError(
            f"{path}: its rows do not fit MiniLM's table ({len(base)} x {base.shape[1]}): "
            f"ids {ids.shape} {ids.dtype}, rows {rows.shape} {rows.dtype}, "
            f"scales {scales.shape} {scales.dtype}"
        )
    if not np.isfinite(scales).all():
        raise ConfigError(f"{path}: its scales are not all finite numbers")
    table = np.array(base, dtype=np.float32, copy=True)
    table[ids] = rows.astype(np.float32) * scales.astype(np.float32)[:, None]
    return table


def save(table: Any, base: Any, teacher_version: str, path: Path, tolerance: float = 1e-4) -> int:
    """Write the rows of `table` that differ from `base` as `load` reads them (each row in
    int8 with its largest magnitude as its scale); returns how many."""
    import numpy as np

    changed = np.flatnonzero(np.abs(table - base).max(axis=1) > tolerance).astype(np.int32)
    rows = table[changed]
    scales = np.abs(rows).max(axis=1) / 127.0
    scales[scales == 0] = 1.0
    quantised = np.clip(np.rint(rows / scales[:, None]), -127, 127).astype(np.int8)
    with path.open("wb") as out:  # a file, so that numpy adds no suffix to the name
        np.savez_compressed(
            out,
            ids=changed,
            rows=quantised,
            scales=scales.astype(np.float32),
            teacher_version=np.array(teacher_version),
        )
    return len(changed)
