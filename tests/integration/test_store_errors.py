"""Store errors carry no user content into the logs (issue 14)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from shared.config import DatabaseConfig
from shared.store.engine import create_engine


async def test_a_failed_statement_s_error_carries_no_user_content(database_url: str) -> None:
    """A store error logged with `repr(exc)` used to carry the statement's parameters: whole
    user messages and model replies."""
    engine = create_engine(DatabaseConfig(), database_url)
    try:
        async with engine.connect() as conn:
            with pytest.raises(DBAPIError) as failed:
                await conn.execute(
                    text("SELECT CAST(:message AS text), 1 / 0"), {"message": "my card is 4242"}
                )
    finally:
        await engine.dispose()
    assert "4242" not in repr(failed.value) and "4242" not in str(failed.value)
