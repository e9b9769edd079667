"""Tasks from a file: JSON Lines (built in) or Parquet (with `pyarrow` installed).

Each row is one task: `id` (a non-empty string, unique in the file) and `split` (`train` or
`test`) are required, `kind` is optional (default `task`), and every other field becomes the
task's `data`. A bad row is a `TaskFileError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from shared.envs.protocol import Split, TaskSpec
from shared.errors import PermanentError

SPLITS: tuple[Split, ...] = ("train", "test")


class TaskFileError(PermanentError):
    """A task file that cannot be read, or a row in it that is not a task."""


def read_tasks(path: Path) -> list[TaskSpec]:
    """Every task in `path`, in file order."""
    if not path.is_file():
        raise TaskFileError(f"task file {path} does not exist")
    if path.suffix == ".parquet":
        return parse_rows(_parquet_rows(path), str(path))
    if path.suffix in (".jsonl", ".ndjson"):
        return parse_jsonl(path.read_text(encoding="utf-8"), str(path))
    raise TaskFileError(f"task file {path}: expected a .jsonl or .parquet file")


def parse_jsonl(text: str, source: str) -> list[TaskSpec]:
    """Tasks from JSON Lines text; blank lines are skipped."""

    def rows() -> Iterable[tuple[int, Any]]:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{source} line {number}: not JSON: {exc.msg}") from None
            except RecursionError:
                raise TaskFileError(f"{source} line {number}: JSON nested too deeply") from None

    return parse_rows(rows(), source)


def parse_rows(rows: Iterable[tuple[int, Any]], source: str) -> list[TaskSpec]:
    """Tasks from (line number, decoded row) pairs."""
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    for number, row in rows:
        where = f"{source} line {number}"
        task = _task(row, where)
        if task.id in seen:
            raise TaskFileError(f"{where}: task id {task.id!r} repeats line {seen[task.id]}")
        seen[task.id] = number
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{source} holds no tasks")
    return tasks


def _task(row: Any, where: str) -> TaskSpec:
    if not isinstance(row, Mapping):
        raise TaskFileError(f"{where}: a task is a JSON object, got {type(row).__name__}")
    task_id, split, kind = row.get("id"), row.get("split"), row.get("kind", "task")
    if not isinstance(task_id, str) or not task_id.strip():
        raise TaskFileError(f"{where}: 'id' must be a non-empty string, got {task_id!r}")
    if split not in SPLITS:
        raise TaskFileError(f"{where}: 'split' must be 'train' or 'test', got {split!r}")
    if not isinstance(kind, str) or not kind.strip():
        raise TaskFileError(f"{where}: 'kind' must be a non-empty string, got {kind!r}")
    data = {k: v for k, v in row.items() if k not in ("id", "split", "kind")}
    return TaskSpec(id=task_id, kind=kind, split=cast(Split, split), data=data)


def _parquet_rows(path: Path) -> Iterable[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskFileError(
            f"task file {path}: reading Parquet needs pyarrow (pip install pyarrow)"
        ) from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskFileError(f"task file {path}: not a readable Parquet file: {exc}") from None
    return enumerate(table.to_pylist(), start=1)
