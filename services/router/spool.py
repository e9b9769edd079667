"""Answered turns kept on local disk when the store cannot take them before the router stops.

A router stopping with turns still unwritten (the store down past its shutdown grace) puts
them in `<dir>/<uuid>.jsonl`, one turn a line, written whole or not at all. While the store
refuses turns, the router also appends them to a journal of its own as it finds them
unwritable (`Journal`), so a router that dies then (killed, out of memory) leaves them behind
too; the journal goes once they are written. A router
starting claims every spool file by renaming it to its own name (so two processes never take
the same one; a claim whose process died is taken again), queues its turns before any new
one, and deletes the file once they are written. A turn written twice (a process that died
between the commit and the delete) is recognised by the store: a new conversation by its
trajectory's id, a continued one by its tip (`recorder.keep`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import msgspec

from services.router.recorder import Answered
from shared.embedded import pid_alive
from shared.logging import get_logger

log = get_logger(__name__)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Answered)


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, turns: list[Answered]) -> Path:
        """Write `turns` to a new spool file; its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{uuid.uuid4()}.jsonl"
        partial = path.with_suffix(".partial")
        with partial.open("wb") as fh:
            for answered in turns:
                fh.write(_encoder.encode(answered) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        partial.replace(path)  # whole or absent
        return path

    def journal(self) -> Journal:
        """A file of this process's own, for turns the store refuses while it is down: it
        is a claim from the start (no live router takes it), and one a process left behind
        when it died is taken by the next router to start, like any spool file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return Journal(self.directory / f"{uuid.uuid4()}.jsonl.{os.getpid()}.claimed")

    def claim(self) -> list[tuple[Path, list[Answered]]]:
        """Every spool file no live process holds, renamed to this process's claim, with its
        turns. A line that does not decode is logged and skipped (the rest are kept)."""
        if not self.directory.is_dir():
            return []
        claimed = []
        for path in sorted(self.directory.iterdir()):
            if not self._free(path):
                continue
            own = self.directory / f"{path.name.split('.')[0]}.jsonl.{os.getpid()}.claimed"
            try:
                path.rename(own)
            except FileNotFoundError:  # another process claimed it first
                continue
            claimed.append((own, self._read(own)))
        return claimed

    @staticmethod
    def _free(path: Path) -> bool:
        parts = path.name.split(".")
        if parts[-1] == "jsonl":
            return True
        if parts[-1] == "claimed" and len(parts) == 4 and parts[2].isdigit():
            return int(parts[2]) != os.getpid() and not pid_alive(int(parts[2]))
        return False

    @staticmethod
    def _read(path: Path) -> list[Answered]:
        turns = []
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                turns.append(_decoder.decode(line))
            except msgspec.DecodeError as exc:
                log.error(
                    "spooled turn unreadable; skipped", file=str(path), line=number, error=str(exc)
                )
        return turns


class Journal:
    """Turns appended as they are found unwritable, each batch on disk (fsync) before the
    next retry; deleted once every turn in it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("ab")

    def append(self, turns: list[Answered]) -> None:
        for answered in turns:
            self._file.write(_encoder.encode(answered) + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def delete(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)
