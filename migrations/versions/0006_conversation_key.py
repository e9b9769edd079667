"""Conversations: the API key a conversation was opened with, so its history hash is looked
up only for that key (two users who open alike no longer share a conversation).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 13:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("api_key_id", sa.UUID(), nullable=True))
    op.create_foreign_key(
        op.f("fk_conversations_api_key_id_api_keys"),
        "conversations",
        "api_keys",
        ["api_key_id"],
        ["id"],
        ondelete="SET NULL",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_conversations_api_key_id_api_keys"), "conversations", type_="foreignkey"
    )
    op.drop_column("conversations", "api_key_id")
