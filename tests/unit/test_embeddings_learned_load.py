"""The learned static table is loaded once, however many threads ask for it at once
(routing's warm-up and a first request did, and read the plain table twice)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared import embeddings
from shared.routing import learned_table


def test_concurrent_first_embeds_load_the_tables_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "static.npy"
    np.save(plain, np.eye(4, dtype=np.float32))
    reads: list[Path] = []
    learned: list[Any] = []

    def table_file(cache_dir: Path | None = None) -> Path:
        reads.append(plain)
        return plain

    def slow_load(base: Any, teacher_version: str, path: Path) -> Any:
        learned.append(path)
        time.sleep(0.2)  # long enough for every other thread to ask meanwhile
        return base * 2

    monkeypatch.setattr(embeddings, "static_table_file", table_file)
    monkeypatch.setattr(embeddings, "word_ids", lambda: object())
    monkeypatch.setattr(embeddings, "teacher_version", lambda: "test")
    monkeypatch.setattr(learned_table, "load", slow_load)
    static = embeddings.LearnedStatic(path=tmp_path / "learned.npz", cache_dir=tmp_path)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(static._load()[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reads) == 1 and len(learned) == 1
    assert len(got) == 4 and all(table is got[0] for table in got)
    assert static.ready and static._table is None  # the plain rows not kept beside them
    assert float(got[0][0, 0]) == 2.0
