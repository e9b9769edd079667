"""The router's spool: turns the store did not take, on local disk until a router (this one,
or the next) writes them. Whose a file is, is a lock on it, not a process id (the same pid
every container start)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from services.router.conversations import Known, tip
from services.router.recorder import Answered, Opening, Turn
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


def test_a_partial_file_is_never_read_and_a_bad_line_costs_only_itself(tmp_path: Path) -> None:
    path = Spool(tmp_path).put([_turn("one", True), _turn("two", False)])
    (tmp_path / "x.partial").write_text("{not json")
    lines = path.read_bytes().splitlines()
    path.write_bytes(lines[0] + b"\n{broken\n" + lines[1] + b"\n")
    [(_, back)] = Spool(tmp_path).claim()
    assert [t.messages[0]["content"] for t in back] == ["one", "two"]


def test_no_directory_is_no_turns(tmp_path: Path) -> None:
    assert Spool(tmp_path / "absent").claim() == []
