"""Keyset paging for every list of the control API: newest first, a page of `limit` rows,
and an opaque cursor naming where the next page starts (stable while rows are added)."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Select, tuple_

DEFAULT_LIMIT = 50
MAX_LIMIT = 200


class BadPageError(ValueError):
    """A `limit` or `cursor` that cannot be used; the message says why."""


def limit_of(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise BadPageError(f"limit must be a whole number, not {raw[:40]!r}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadPageError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit


def encode(created_at: datetime, row_id: uuid.UUID) -> str:
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, row_id = raw.split("|")
        return datetime.fromisoformat(stamp), uuid.UUID(row_id)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadPageError("cursor is not one this API gave (pass next_cursor as it is)") from None


def paged(query: Select[Any], model: Any, cursor: str | None, limit: int) -> Select[Any]:
    """`query` ordered newest first from `cursor` on, one row more than a page (to tell
    whether another page follows)."""
    if cursor is not None:
        created_at, row_id = decode(cursor)
        query = query.where(tuple_(model.created_at, model.id) < tuple_(created_at, row_id))
    return query.order_by(model.created_at.desc(), model.id.desc()).limit(limit + 1)


def page(rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """The page's rows and the cursor of the next page (None when this is the last)."""
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], encode(last.created_at, last.id)
