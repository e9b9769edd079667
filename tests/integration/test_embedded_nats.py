"""The embedded NATS takes no anonymous client (issue 14: "NATS accepts anonymous clients";
the embedded one listened on 127.0.0.1 with no credential, and every user of the machine
reaches that address; the bus carries every tenant's trajectories). A real nats-server."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import nats
import pytest
from nats.errors import Error as NatsError

from shared.cli.context import RunState, state_path, write_state
from shared.config import ServiceConfig, StorageConfig
from shared.embedded import ensure_nats, pid_alive, stop_embedded


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    url = ensure_nats(tmp_path)
    try:
        yield tmp_path, url
    finally:
        stop_embedded(tmp_path)


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_a_client_needs_the_password_the_server_was_started_with(
    embedded: tuple[Path, str],
) -> None:
    _, url = embedded
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.username and parts.password
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        await js.add_stream(name="EMBEDDED", subjects=["embedded.>"])
        assert (await js.publish("embedded.x", b"1")).seq == 1
    finally:
        await client.close()
    anonymous = f"nats://127.0.0.1:{parts.port}"
    wrong = f"nats://{parts.username}:not-the-password@127.0.0.1:{parts.port}"
    for refused in (anonymous, wrong):
        with pytest.raises(NatsError, match="Authorization Violation"):
            await nats.connect(refused, allow_reconnect=False, connect_timeout=5)


def test_the_password_is_in_files_only_its_owner_reads_and_not_on_the_command_line(
    embedded: tuple[Path, str],
) -> None:
    data, url = embedded
    password = urlsplit(url).password
    assert password
    root = data / "nats"
    assert private(root / "server.json") and private(root / "nats-server.conf")
    pid = json.loads((root / "server.json").read_text())["pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()  # what `ps` shows every user
    assert password.encode() not in cmdline and b"-c" in cmdline
    assert password not in (root / "nats-server.log").read_text()


def test_a_second_caller_reuses_the_running_server_and_its_password(
    embedded: tuple[Path, str],
) -> None:
    data, url = embedded
    assert ensure_nats(data) == url
    pid = json.loads((data / "nats" / "server.json").read_text())["pid"]
    assert stop_embedded(data) == ["nats"]
    for _ in range(100):
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    fresh = ensure_nats(data)  # a new server: a new password
    assert urlsplit(fresh).password != urlsplit(url).password


def test_up_s_state_file_with_the_urls_is_its_owner_s_alone(tmp_path: Path) -> None:
    cfg = ServiceConfig(storage=StorageConfig(data_dir=str(tmp_path)))
    state = RunState(
        pid=1,
        nats_url="nats://retrace:secret-password@127.0.0.1:4222",
        database_url="postgresql+asyncpg://retrace:pw@db/retrace",
        schema="public",
        services={},
    )
    write_state(cfg, state)
    assert private(state_path(cfg))
