"""Answered turns kept on local disk when the store cannot take them before the router stops.

A router stopping with turns still unwritten (the store down past its shutdown grace) puts
them in `<dir>/<uuid>.jsonl`, one turn a line, written whole or not at all. While the store
refuses turns, the router also appends them to a journal of its own as it finds them
unwritable (`<uuid>.journal`), so a router that dies then (killed, out of memory) leaves them
behind too; the journal goes once they are written.

Whose a file is, is an exclusive `flock` on it: a journal's router holds one from the
start, and a router starting takes every file it can lock (a spool file, or the journal of
a router that died: the kernel lets go of a dead process's locks), queues its turns before
any new one, and deletes the file once they are written. Locks, not process ids, so routers
in containers (the same pid every start) or beside each other on one volume never take a
file that is someone's. A turn written twice (a process that died between the commit and
the delete) is recognised by the store: a new conversation by its trajectory's id, a
continued one by its history (`recorder.keep`).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path
from typing import IO

import msgspec

from services.router.recorder import Answered
from shared.errors import UNDECODABLE
from shared.logging import get_logger
from shared.runtime.files import open_private

log = get_logger(__name__)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Answered)
KINDS = (".jsonl", ".journal")


class Held:
    """A spool file this process holds (its lock kept until `delete` or `release`)."""

    def __init__(self, path: Path, handle: IO[bytes]) -> None:
        self.path = path
        self._handle = handle

    def delete(self) -> None:
        """Its turns are written: remove it, then let go of it."""
        self.path.unlink(missing_ok=True)
        self._handle.close()

    def release(self) -> None:
        """Let go of it, left on disk for the next router."""
        self._handle.close()


class Journal(Held):
    """Turns appended as they are found unwritable, each batch on disk (fsync) before the
    next retry."""

    def append(self, turns: list[Answered]) -> None:
        _write(self._handle, turns)


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, turns: list[Answered]) -> Path:
        """Write `turns` to a new spool file; its path."""
        path = self.directory / f"{uuid.uuid4()}.jsonl"
        partial = path.with_suffix(".partial")
        with open_private(partial) as fh:  # conversations: the owner's alone
            _write(fh, turns)
        partial.replace(path)  # whole or absent
        return path

    def journal(self) -> Journal:
        """A journal of this process's own, locked from the start."""
        path = self.directory / f"{uuid.uuid4()}.journal"
        handle = open_private(path)
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else has it
        return Journal(path, handle)

    def claim(self) -> list[tuple[Held, list[Answered]]]:
        """Every spool file and journal nobody holds, now held by this process, with its
        turns. A line that does not decode (a journal cut off mid-line) is logged and
        skipped; the rest are kept."""
        if not self.directory.is_dir():
            return []
        claimed = []
        for path in sorted(self.directory.iterdir()):
            if path.suffix not in KINDS:
                continue
            held = _lock(path)
            if held is not None:
                claimed.append((held, _read(path)))
        return claimed


def _write(handle: IO[bytes], turns: list[Answered]) -> None:
    """`turns` one a line, on disk (fsync) when this returns."""
    for answered in turns:
        handle.write(_encoder.encode(answered) + b"\n")
    handle.flush()
    os.fsync(handle.fileno())


def _lock(path: Path) -> Held | None:
    """`path` held by this process, or None: someone holds it, or it went meanwhile."""
    try:
        handle = path.open("rb+")
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    try:  # the one who held it before may have written it and deleted it meanwhile
        same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        same = False
    if not same:
        handle.close()
        return None
    return Held(path, handle)


def _read(path: Path) -> list[Answered]:
    turns = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            turns.append(_decoder.decode(line))
        except UNDECODABLE as exc:
            log.error(
                "spooled turn unreadable; skipped", file=str(path), line=number, error=str(exc)
            )
    return turns
