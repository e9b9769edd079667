"""The router's spool: turns the store did not take, on local disk until a router (this one,
or the next) writes them. Whose a file is, is a lock on it, not a process id (the same pid
every container start)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from services.router.conversations import Known, tip
from services.router.recorder import Answered, Opening, Recorder, Turn
from services.router.spool import Spool


def _turn(text: str, opening: bool) -> Answered:
    agent = uuid.uuid4()
    known = Known(uuid.uuid4(), agent, None, None, {"mode": "base"}, "", 0)
    messages = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Done.", "tool_calls": [{"id": "c1", "type": "function"}]},
    ]
    first = Opening(agent, None, None, {"mode": "base"}) if opening else None
    return Answered(Turn("acme", known, "", 0, opening=first), "m", messages, tip(messages), 3, 1.5)


def test_turns_come_back_as_they_went_and_to_one_holder_at_a_time(tmp_path: Path) -> None:
    turns = [_turn("hello", True), _turn("again \u00e9\u4e2d", False)]
    path = Spool(tmp_path).put(turns)
    [(held, back)] = Spool(tmp_path).claim()
    assert back == turns  # every field, the opening's trajectory id included
    assert Spool(tmp_path).claim() == []  # held: nobody takes it again, this process neither
    held.release()  # left for the next router
    [(again, _)] = Spool(tmp_path).claim()
    again.delete()
    assert not path.exists() and Spool(tmp_path).claim() == []


def test_a_journal_is_its_router_s_until_it_dies(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    journal = spool.journal()
    journal.append([_turn("one", True)])
    journal.append([_turn("two", False)])
    assert spool.claim() == []  # its router lives
    script = (
        "import os, signal, sys; from pathlib import Path; "
        "from services.router.spool import Spool; "
        "from tests.unit.test_router_spool import _turn; "
        "j = Spool(Path(sys.argv[1])).journal(); j.append([_turn('three', True)]); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    died = subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False)
    assert died.returncode == -9
    [(held, back)] = spool.claim()  # the dead router's, not the live one's
    assert [t.messages[0]["content"] for t in back] == ["three"]
    journal.release()  # this router stops with its journal unwritten
    [(_, mine)] = spool.claim()
    assert [t.messages[0]["content"] for t in mine] == ["one", "two"]
    held.delete()


def test_spooled_conversations_are_the_owner_s_alone(tmp_path: Path) -> None:
    """They hold users' whole conversations: spool files and journals were made with the
    process's umask (world-readable under the usual 022), their directory too."""
    was = os.umask(0o022)
    try:
        directory = tmp_path / "spool" / "router"
        spool = Spool(directory)
        path = spool.put([_turn("hello", True)])
        journal = spool.journal()
    finally:
        os.umask(was)
    journal.append([_turn("again", False)])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    journal.release()


def test_a_partial_file_is_never_read_and_a_bad_line_costs_only_itself(tmp_path: Path) -> None:
    path = Spool(tmp_path).put([_turn("one", True), _turn("two", False)])
    (tmp_path / "x.partial").write_text("{not json")
    lines = path.read_bytes().splitlines()
    # a torn line, and a byte the disk got wrong inside a string (not UTF-8: msgspec raised
    # UnicodeDecodeError there, not its DecodeError, and the router failed to start)
    not_utf8 = lines[0].replace(b"one", b"\xff\xfe")
    path.write_bytes(lines[0] + b"\n{broken\n" + not_utf8 + b"\n" + lines[1] + b"\n")
    [(_, back)] = Spool(tmp_path).claim()
    assert [t.messages[0]["content"] for t in back] == ["one", "two"]


def test_no_directory_is_no_turns(tmp_path: Path) -> None:
    assert Spool(tmp_path / "absent").claim() == []


def _journaled(directory: Path) -> int:
    [journal] = list(directory.glob("*.journal"))
    return len([line for line in journal.read_bytes().splitlines() if line])


class _DownStore:
    """A store whose every session fails as a stopped Postgres's does."""

    def tenant(self, _: str) -> object:
        raise ConnectionRefusedError("the store is down")


async def test_turns_answered_while_the_journal_is_written_are_journaled_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full suite caught it: the journal's high-water mark was read after its write, so
    turns answered during the write were counted as journaled and lost with a killed router."""
    from services.router import spool as spool_module

    gate = threading.Event()
    real = spool_module.Journal.append

    def slow(self: spool_module.Journal, turns: list[Answered]) -> None:
        gate.wait(10)
        real(self, turns)

    monkeypatch.setattr(spool_module.Journal, "append", slow)
    recorder = Recorder(_DownStore(), limit=100, spool=Spool(tmp_path))  # type: ignore[arg-type]
    recorder.start()
    recorder.submit(_turn("first", True))
    await asyncio.sleep(0.2)  # the write failed; the journal's append waits at the gate
    for n in range(5):
        recorder.submit(_turn(f"during {n}", True))
    gate.set()
    await asyncio.sleep(1.5)  # the next retry (0.5 s later) journals what came meanwhile
    assert await asyncio.to_thread(_journaled, tmp_path) == 6
    assert recorder._task is not None
    recorder._task.cancel()
