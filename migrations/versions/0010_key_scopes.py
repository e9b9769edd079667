"""What an API key may do: `all` (every route, as every key could before), `read` (the
control API's reads and the console) or `inference` (the router only), so the key an
application sends with each request cannot mint keys or change agents (issue 14). Keys
made before it are `all`. Going back revokes the scoped keys (they would do everything).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_keys", sa.Column("scope", sa.String(16), nullable=False, server_default="all")
    )
    op.create_check_constraint(
        op.f("ck_api_keys_scope"), "api_keys", "scope IN ('all', 'read', 'inference')"
    )


def downgrade() -> None:
    # without the column every key may do everything: a scoped key is revoked, not widened
    op.execute("UPDATE api_keys SET revoked_at = now() WHERE scope <> 'all' AND revoked_at IS NULL")
    op.drop_constraint(op.f("ck_api_keys_scope"), "api_keys", type_="check")
    op.drop_column("api_keys", "scope")
