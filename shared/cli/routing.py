"""`retrace routing-pack write DIR` and `retrace routing-pack check DIR`: routing's tables for
an install without the embedding model (`shared.routing.pack`)."""

from __future__ import annotations

from pathlib import Path

import click

from shared.cli.context import make_console
from shared.errors import ConfigError
from shared.routing import pack

console = make_console()


@click.group("routing-pack")
def routing_pack() -> None:
    """Routing's tables for a router or evaluator without the embedding model (point
    RETRACE_ROUTING_PACK at the directory)."""


@routing_pack.command("write")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def write(directory: Path) -> None:
    """Write a pack to DIRECTORY from the installed model (the train extra)."""
    try:
        written = pack.build(directory)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    _describe(written, "written")


@routing_pack.command("check")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def check(directory: Path) -> None:
    """Check the pack in DIRECTORY as a router would open it."""
    try:
        opened = pack.open_pack(directory.expanduser().resolve())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    _describe(opened, "checked")


def _describe(opened: pack.Pack, done: str) -> None:
    m = opened.manifest
    console.print(
        f"routing pack {done}: {opened.path} ({m.teacher} {m.teacher_version}, "
        f"table {m.rows} x {m.dim}, sha256 {m.table_sha256[:12]})"
    )
