"""The router's spool: turns the store did not take before a stop, on local disk until a
router starts again."""

from __future__ import annotations

import os
import subprocess
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


def test_turns_come_back_as_they_went_and_only_once(tmp_path: Path) -> None:
    turns = [_turn("hello", True), _turn("again \u00e9\u4e2d", False)]
    Spool(tmp_path).put(turns)
    [(claimed, back)] = Spool(tmp_path).claim()
    assert back == turns  # every field, the opening's trajectory id included
    assert claimed.exists() and str(os.getpid()) in claimed.name
    assert Spool(tmp_path).claim() == []  # this process holds it: nobody takes it again


def test_a_claim_whose_process_died_is_taken_again(tmp_path: Path) -> None:
    Spool(tmp_path).put([_turn("hello", True)])
    gone = subprocess.Popen(["true"])  # a pid that no longer runs
    gone.wait()
    [path] = list(tmp_path.iterdir())
    path.rename(tmp_path / f"{path.name}.{gone.pid}.claimed")
    [(_, back)] = Spool(tmp_path).claim()
    assert [t.messages[0]["content"] for t in back] == ["hello"]


def test_a_partial_file_is_never_read_and_a_bad_line_costs_only_itself(tmp_path: Path) -> None:
    path = Spool(tmp_path).put([_turn("one", True), _turn("two", False)])
    (tmp_path / "x.partial").write_text("{not json")
    lines = path.read_bytes().splitlines()
    path.write_bytes(lines[0] + b"\n{broken\n" + lines[1] + b"\n")
    [(_, back)] = Spool(tmp_path).claim()
    assert [t.messages[0]["content"] for t in back] == ["one", "two"]


def test_no_directory_is_no_turns(tmp_path: Path) -> None:
    assert Spool(tmp_path / "absent").claim() == []


def test_a_journal_is_nobody_else_s_while_its_router_lives(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    journal = spool.journal()
    journal.append([_turn("one", True)])
    journal.append([_turn("two", False)])
    assert spool.claim() == []  # this process's own, alive
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = journal.path.with_name(journal.path.name.replace(str(os.getpid()), str(gone.pid)))
    journal.path.rename(dead)
    [(_, back)] = spool.claim()
    assert [t.messages[0]["content"] for t in back] == ["one", "two"]
