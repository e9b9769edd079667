"""Tenants' quotas (agents, cycles at once, cycles a day): a JSON object on the tenant's
row, `{}` for none (shared/store/quotas.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tenants",
        sa.Column(
            "quotas", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
    )


def downgrade() -> None:
    op.drop_column("tenants", "quotas")
