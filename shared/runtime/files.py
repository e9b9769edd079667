"""Files that hold secrets (passwords, keys) or users' content (spooled conversations):
readable by their owner alone from the first byte."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


def write_private(path: Path, text: str) -> None:
    """Write `path` whole (a reader sees the old file or the new one), mode 600. The text goes
    to a new file beside it, created exclusively and never through a link, so a link or a
    looser file planted at either name is not written through; the rename replaces a link
    at `path` rather than following it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)  # a stale one of this pid's, or one planted there
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)


def open_private(path: Path) -> BinaryIO:
    """A new file at `path`, mode 600, open for appending bytes; created exclusively and
    never through a link (what is there already, link or file, is an error). Its directory
    is made owner-only where this makes it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    return os.fdopen(os.open(path, flags, 0o600), "ab")
