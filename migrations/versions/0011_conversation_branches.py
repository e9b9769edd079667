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


def upgrade() -> None:
    # no foreign key: a branch may be written before the conversation it branched from
    # (another router process answered that one, and has not written it yet)
    op.add_column("conversations", sa.Column("branch_of", sa.UUID(), nullable=True))
    op.execute(
        """
        UPDATE conversations SET branch_of = (route->>'branch_of')::uuid
        WHERE route->>'branch_of' ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        """
    )
    op.create_index(
        op.f("ix_conversations_tenant_id_branch_of"),
        "conversations",
        ["tenant_id", "branch_of"],
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_conversations_tenant_id_branch_of"), "conversations")
    op.drop_column("conversations", "branch_of")
