"""Secrets written to files (the embedded NATS's password, `retrace up`'s URLs, the operator's
key): whole, owner-only, and never written through a link planted where they go."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shared.runtime.files import write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_its_owner_s_alone(tmp_path: Path) -> None:
    path = tmp_path / "run" / "secret.json"
    write_private(path, "pw")
    assert path.read_text() == "pw" and mode(path) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secret.json"]  # no partial left


def test_an_old_looser_file_is_replaced_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new" and mode(path) == 0o600


def test_links_at_either_name_are_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    path = tmp_path / "secret"
    path.symlink_to(target)
    (tmp_path / f".secret.{os.getpid()}.partial").symlink_to(target)
    write_private(path, "pw")
    assert not path.is_symlink() and path.read_text() == "pw" and mode(path) == 0o600
    assert target.read_text() == "untouched"
