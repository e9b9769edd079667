"""Where tests find NATS and Postgres: the machine's own servers when reachable, else embedded."""

from __future__ import annotations

import os
import socket
import tempfile
from functools import cache
from pathlib import Path

from shared.embedded import ensure_nats, ensure_postgres

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_DB = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def _reachable(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@cache
def _embedded_dir() -> Path:
    return Path(os.environ.get("RETRACE_TEST_DATA_DIR") or tempfile.mkdtemp(prefix="retrace-test-"))


@cache
def nats_url() -> str:
    if url := os.environ.get("RETRACE_TEST_NATS_URL"):
        return url
    return LOCAL_NATS if _reachable(4222) else ensure_nats(_embedded_dir())


@cache
def database_url() -> str:
    if url := os.environ.get("RETRACE_TEST_DATABASE_URL"):
        return url
    return LOCAL_DB if _reachable(5432) else ensure_postgres(_embedded_dir())
