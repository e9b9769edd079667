"""A tenant's row announces its changes too (its quotas: the router keeps each tenant's
request rate with its keys and drops them when the row changes), on the channel of 0007.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 05:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE TRIGGER tenants_changed AFTER UPDATE OR DELETE ON tenants "
        "FOR EACH ROW EXECUTE FUNCTION retrace_notify_change()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER tenants_changed ON tenants")
