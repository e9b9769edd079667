"""Adapters: the held-out check the train service runs on each new adapter (the adapter and
the base model on the environment's test split, unhinted, with a 95% interval on the gain).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "adapters",
        sa.Column(
            "heldout",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("adapters", "heldout")
