"""The keys a model server accepts, rotatable without a restart.

A model server holds every tenant's adapters in memory, so restarting it to change its key
costs minutes of service. Its keys can therefore come from a key file as well as from
`--api-key`: every key listed is accepted, and the file is read again when it changes (or on
SIGHUP), so a key is rotated by listing the new one beside the old, moving the callers to the
new one, then deleting the old line (docs/serving.md).

A key file holds one key per line; blank lines and lines starting with `#` are skipped. A key
is a bearer token (RFC 6750: letters, digits and `-._~+/`, then `=` padding) of at least
`MIN_KEY_LENGTH` characters. A file that cannot be read or holds a bad line is refused at
start; when it changes into one, the keys in force stay and the reason is logged, so a
half-written file neither opens the server nor locks every caller out. Errors name the line,
never its text: the text may be a key.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError
from shared.logging import get_logger

log = get_logger(__name__)

MIN_KEY_LENGTH = 16
"""Shorter keys are refused in a key file (`retrace up` generates 32 characters)."""
MAX_FILE_BYTES = 64 << 10
"""A key file is a few lines; a larger one is refused (not a key file named by mistake)."""
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class KeyFileError(ConfigError):
    """A key file that cannot be used, with the line at fault (never its text)."""


@dataclass(frozen=True)
class _Stamp:
    """What tells a changed file from the one read: a rename into place (as Kubernetes
    updates a mounted secret) changes the inode, an edit in place the time or size."""

    inode: int
    mtime_ns: int
    size: int


def parse_keys(text: str, source: str) -> frozenset[str]:
    """The keys in a key file's `text`; `KeyFileError` naming the first bad line."""
    keys: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not _TOKEN.fullmatch(line):
            raise KeyFileError(
                f"{source}, line {number}: not a bearer token (letters, digits and -._~+/ "
                "only, then = padding; one key per line)"
            )
        if len(line) < MIN_KEY_LENGTH:
            raise KeyFileError(
                f"{source}, line {number}: a key needs at least {MIN_KEY_LENGTH} characters, "
                f"this one has {len(line)}"
            )
        keys.add(line)
    if not keys:
        raise KeyFileError(f"{source} lists no key (one key per line; # starts a comment)")
    return frozenset(keys)


class KeyRing:
    """The keys one kind of caller may present: `key` (the command line's) and those listed
    in `file`, re-read by `reload` when it has changed."""

    def __init__(self, key: str | None = None, file: Path | None = None, *, kind: str = "key"):
        self.kind = kind
        self.file = file
        self._fixed = frozenset({key}) if key else frozenset()
        self._listed: frozenset[str] = frozenset()
        self._stamp: _Stamp | None = None
        self._failing: str | None = None
        """The last reload's error, logged once rather than at every poll."""
        self._lock = threading.Lock()  # reloads run in worker threads
        self._encoded: tuple[bytes, ...] = tuple(k.encode() for k in self._fixed)
        if file is not None:
            stamp, listed = self._read(file)
            self._install(stamp, listed)

    @property
    def required(self) -> bool:
        """Whether any key is set (none: the routes it guards are open)."""
        return bool(self._encoded)

    def __len__(self) -> int:
        return len(self._encoded)

    def accepted(self) -> frozenset[str]:
        """The keys accepted now (for the start's warnings; never logged)."""
        return self._fixed | self._listed

    def accepts(self, token: bytes) -> bool:
        """Whether `token` is one of the keys. Every key is compared, each in constant time,
        so the time taken tells nothing of which key came close."""
        found = False
        for key in self._encoded:
            found |= hmac.compare_digest(token, key)
        return found

    def reload(self) -> bool:
        """Read the key file again if it changed; whether the keys changed. A file that is
        gone, unreadable or holds a bad line leaves the keys as they were (logged)."""
        if self.file is None:
            return False
        with self._lock:
            try:
                if self._stamp == _stamp(self.file):
                    return False
                stamp, listed = self._read(self.file)
            except (OSError, KeyFileError) as exc:
                error = str(exc) if isinstance(exc, KeyFileError) else exc.strerror or str(exc)
                if error != self._failing:
                    self._failing = error
                    log.error(
                        "key file not reloaded; the keys in force stay",
                        kind=self.kind,
                        file=str(self.file),
                        error=error,
                    )
                return False
            self._failing = None
            changed = listed != self._listed
            self._install(stamp, listed)
        if changed:
            log.info(
                "key file reloaded", kind=self.kind, file=str(self.file), keys=len(self._encoded)
            )
        return changed

    def _install(self, stamp: _Stamp, listed: frozenset[str]) -> None:
        self._stamp = stamp
        self._listed = listed
        # One tuple swapped in whole: a request reading it sees the old keys or the new.
        self._encoded = tuple(k.encode() for k in sorted(self._fixed | listed))

    def _read(self, file: Path) -> tuple[_Stamp, frozenset[str]]:
        try:
            if not stat.S_ISREG(os.stat(file).st_mode):  # before open: a FIFO would block it
                raise KeyFileError(f"{self.kind} file {file} is not a regular file")
            with file.open("rb") as f:
                info = os.fstat(f.fileno())
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise KeyFileError(f"{self.kind} file {file}: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise KeyFileError(f"{self.kind} file {file} is over {MAX_FILE_BYTES} bytes")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "key file readable by others than its owner (chmod 600 it)",
                kind=self.kind,
                file=str(file),
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise KeyFileError(f"{self.kind} file {file} is not UTF-8 text") from None
        return _Stamp(info.st_ino, info.st_mtime_ns, info.st_size), parse_keys(
            text, f"{self.kind} file {file}"
        )


def _stamp(file: Path) -> _Stamp:
    info = os.stat(file)
    return _Stamp(info.st_ino, info.st_mtime_ns, info.st_size)
