"""Conversations: the conversation a branch was made from (`branch_of`), indexed, so a turn
written after another router process moved its conversation on finds the branches already
made (it goes on in the one at the tip it found, and a turn replayed from the spool is
known as written): before, each such turn made a branch of its own.
It was only in `route.branch_of` (JSON, not indexed); it stays there too.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


INDEX = "ix_conversations_tenant_id_branch_of"


def upgrade() -> None:
    # Outside the migration's transaction, each statement committed as it ends, so routers
    # keep reading and writing conversations: the column's lock is held for an instant, the
    # backfill locks only the branched rows it writes, and the index is built CONCURRENTLY.
    # A run cut short has committed what it did, so each step may find itself done.
    # No foreign key: a branch may be written before the conversation it branched from
    # (another router process answered that one, and has not written it yet).
    context = op.get_context()
    with context.autocommit_block():
        op.execute("ALTER TABLE conversations ADD COLUMN IF NOT EXISTS branch_of uuid")
        op.execute(
            """
            UPDATE conversations SET branch_of = (route->>'branch_of')::uuid
            WHERE branch_of IS NULL
              AND route->>'branch_of'
                  ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
            """
        )
        # what a concurrent build cut short leaves: kept up by every write, never read (the
        # offline script, `--sql`, cannot ask: there drop such an index by hand first)
        if not context.as_sql and _invalid(INDEX):
            op.drop_index(INDEX, "conversations", postgresql_concurrently=True)
        op.create_index(
            INDEX,
            "conversations",
            ["tenant_id", "branch_of"],
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def _invalid(name: str) -> bool:
    found = op.get_bind().execute(
        sa.text(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = :name AND n.nspname = current_schema()"
        ),
        {"name": name},
    )
    return bool(found.scalar())


def downgrade() -> None:
    op.drop_index(INDEX, "conversations")
    op.drop_column("conversations", "branch_of")
