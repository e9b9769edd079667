"""Alembic migrations run from code (`retrace migrate`, service start-up, tests)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

SCRIPT_LOCATION = str(Path(migrations.__file__).parent)
_ALEMBIC = threading.Lock()
"""Alembic keeps its context in module globals: one command at a time per process. Across
processes, env.py takes a Postgres advisory lock."""


def alembic_config(url: str, schema: str = "public") -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.attributes["url"] = url
    cfg.attributes["schema"] = schema
    return cfg


def upgrade(url: str, schema: str = "public", revision: str = "head") -> None:
    with _ALEMBIC:
        command.upgrade(alembic_config(url, schema), revision)


def downgrade(url: str, schema: str = "public", revision: str = "base") -> None:
    with _ALEMBIC:
        command.downgrade(alembic_config(url, schema), revision)


async def upgrade_async(url: str, schema: str = "public", revision: str = "head") -> None:
    """Alembic's env runs its own event loop, so it gets a thread of its own."""
    await asyncio.to_thread(upgrade, url, schema, revision)


async def downgrade_async(url: str, schema: str = "public", revision: str = "base") -> None:
    await asyncio.to_thread(downgrade, url, schema, revision)
