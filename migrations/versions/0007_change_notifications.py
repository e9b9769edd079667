"""Change notifications: an update or delete of an API key, an agent or an adapter is
announced on the Postgres channel `retrace_changes` (payload `<schema>:<table>:<id>`) when its
transaction commits, whichever code path made it (CLI, services, SQL by hand). The router
caches those rows and drops an entry the moment it changes (`shared/store/changes.py`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 08:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("api_keys", "agents", "adapters")


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION retrace_notify_change() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify(
                    'retrace_changes',
                    TG_TABLE_SCHEMA || ':' || TG_TABLE_NAME || ':' || OLD.id::text
                );
            ELSE
                PERFORM pg_notify(
                    'retrace_changes',
                    TG_TABLE_SCHEMA || ':' || TG_TABLE_NAME || ':' || NEW.id::text
                );
            END IF;
            RETURN NULL;
        END
        $$ LANGUAGE plpgsql
        """
    )
    for table in TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_changed AFTER UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION retrace_notify_change()"
        )


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP TRIGGER {table}_changed ON {table}")
    op.execute("DROP FUNCTION retrace_notify_change()")
