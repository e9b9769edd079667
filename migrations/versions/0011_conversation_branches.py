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
    # The index is built CONCURRENTLY, outside the migration's transaction, so routers keep
    # writing conversations while a large table is indexed: a run cut short there has
    # committed the column already, so each step may find itself done and goes on.
    # No foreign key: a branch may be written before the conversation it branched from
    # (another router process answered that one, and has not written it yet).
    op.execute("ALTER TABLE conversations ADD COLUMN IF NOT EXISTS branch_of uuid")
    op.execute(
        """
        UPDATE conversations SET branch_of = (route->>'branch_of')::uuid
        WHERE branch_of IS NULL
          AND route->>'branch_of' ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        """
    )
    context = op.get_context()
    with context.autocommit_block():
        if not context.as_sql and _invalid(INDEX):
            # what a concurrent build cut short leaves: it is kept up but never read
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
            "WHERE c.relname = :name AND c.relnamespace = current_schema()::regnamespace"
        ),
        {"name": name},
    )
    return bool(found.scalar())


def downgrade() -> None:
    op.drop_index(INDEX, "conversations")
    op.drop_column("conversations", "branch_of")
