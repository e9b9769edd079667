"""Task files (shared.envs.kit.tasks): every row is a task or a clear error naming the line."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.envs.kit.tasks import TaskFileError, parse_jsonl, read_tasks

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
rows = st.dictionaries(
    st.sampled_from(["id", "split", "kind", "prompt", "x"]) | st.text(max_size=5),
    json_values | st.sampled_from(["train", "test", "a", ""]),
    max_size=6,
)


@given(st.lists(rows, max_size=6))
def test_any_rows_give_tasks_or_a_task_file_error(items: list[dict[str, Any]]) -> None:
    text = "\n".join(json.dumps(row) for row in items)
    try:
        tasks = parse_jsonl(text, "t.jsonl")
    except TaskFileError as exc:
        assert str(exc).startswith("t.jsonl")
        return
    assert len(tasks) == len(items)
    assert len({t.id for t in tasks}) == len(tasks)
    for task, row in zip(tasks, items, strict=True):
        assert task.id == row["id"] and task.split == row["split"]
        assert task.kind == row.get("kind", "task")
        assert task.data == {k: v for k, v in row.items() if k not in ("id", "split", "kind")}


@given(st.text())
def test_any_text_gives_tasks_or_a_task_file_error(text: str) -> None:
    with contextlib.suppress(TaskFileError):
        parse_jsonl(text, "t.jsonl")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '{"id": "a", "split": "train"}\n{"id": "a", "split": "test"}',
            "line 2: task id 'a' repeats line 1",
        ),
        ('{"id": "a", "split": "dev"}', "line 1: 'split' must be 'train' or 'test', got 'dev'"),
        ('\n{"split": "train"}', "line 2: 'id' must be a non-empty string"),
        ("[1, 2]", "line 1: a task is a JSON object, got list"),
        ('{"id": "a", "split": "train"', "line 1: not JSON"),
        ("", "holds no tasks"),
        ('{"id": "a", "split": "train", "kind": 3}', "'kind' must be a non-empty string"),
    ],
)
def test_each_bad_row_is_named(text: str, problem: str) -> None:
    with pytest.raises(TaskFileError, match=problem):
        parse_jsonl(text, "t.jsonl")


def test_a_file_is_read_by_its_suffix(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text('{"id": "a", "split": "train", "prompt": "hi"}\n', encoding="utf-8")
    [task] = read_tasks(good)
    assert task.data == {"prompt": "hi"} and task.kind == "task"
    with pytest.raises(TaskFileError, match="does not exist"):
        read_tasks(tmp_path / "missing.jsonl")
    other = tmp_path / "tasks.csv"
    other.write_text("id,split\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"expected a \.jsonl or \.parquet file"):
        read_tasks(other)
