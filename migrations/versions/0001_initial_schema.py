"""Initial schema: tenants, keys, agents, environments, tasks, cycles, trajectories, capabilities,
adapters, training jobs, evaluations and processed messages.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 07:18:53.819967
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=63), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "agents",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("environment", sa.Text(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("production_adapters", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_agents_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_agents_tenant_id_name")),
    )
    op.create_index(op.f("ix_agents_tenant_id"), "agents", ["tenant_id"], unique=False)
    op.create_table(
        "api_keys",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_prefix"), "api_keys", ["prefix"], unique=False)
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"], unique=False)
    op.create_table(
        "processed_messages",
        sa.Column("consumer", sa.String(length=100), nullable=False),
        sa.Column("msg_id", sa.String(length=200), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("outbox", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "processed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_processed_messages_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("consumer", "msg_id", name=op.f("pk_processed_messages")),
    )
    op.create_index(
        op.f("ix_processed_messages_tenant_id"), "processed_messages", ["tenant_id"], unique=False
    )
    op.create_table(
        "cycles",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("agent_id", sa.UUID(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_cycles_agent_id_agents"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_cycles_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cycles")),
    )
    op.create_index(op.f("ix_cycles_agent_id"), "cycles", ["agent_id"], unique=False)
    op.create_index(op.f("ix_cycles_tenant_id"), "cycles", ["tenant_id"], unique=False)
    op.create_index(
        "uq_cycles_active_agent",
        "cycles",
        ["tenant_id", "agent_id"],
        unique=True,
        postgresql_where=sa.text("state NOT IN ('completed', 'failed')"),
    )
    op.create_table(
        "capabilities",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("agent_id", sa.UUID(), nullable=False),
        sa.Column("cycle_id", sa.UUID(), nullable=True),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("statistics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_capabilities_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycles.id"],
            name=op.f("fk_capabilities_cycle_id_cycles"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_capabilities_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_capabilities")),
        sa.UniqueConstraint(
            "tenant_id", "cycle_id", "name", name=op.f("uq_capabilities_tenant_id_cycle_id_name")
        ),
    )
    op.create_index(op.f("ix_capabilities_agent_id"), "capabilities", ["agent_id"], unique=False)
    op.create_index(op.f("ix_capabilities_tenant_id"), "capabilities", ["tenant_id"], unique=False)
    op.create_table(
        "evaluations",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("cycle_id", sa.UUID(), nullable=True),
        sa.Column("agent_id", sa.UUID(), nullable=False),
        sa.Column("configuration", sa.Text(), nullable=False),
        sa.Column("results", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("summary", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_evaluations_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycles.id"],
            name=op.f("fk_evaluations_cycle_id_cycles"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_evaluations_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
    )
    op.create_index(op.f("ix_evaluations_tenant_id"), "evaluations", ["tenant_id"], unique=False)
    op.create_index(
        op.f("ix_evaluations_tenant_id_cycle_id"),
        "evaluations",
        ["tenant_id", "cycle_id"],
        unique=False,
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("agent_id", sa.UUID(), nullable=False),
        sa.Column("capability_id", sa.UUID(), nullable=True),
        sa.Column("cycle_id", sa.UUID(), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("artifact_uri", sa.Text(), nullable=False),
        sa.Column("base_model", sa.Text(), nullable=False),
        sa.Column("lora_config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("training_curve", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_adapters_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["capability_id"],
            ["capabilities.id"],
            name=op.f("fk_adapters_capability_id_capabilities"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycles.id"],
            name=op.f("fk_adapters_cycle_id_cycles"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_adapters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
    )
    op.create_index(op.f("ix_adapters_agent_id"), "adapters", ["agent_id"], unique=False)
    op.create_index(op.f("ix_adapters_tenant_id"), "adapters", ["tenant_id"], unique=False)
    op.create_table(
        "environments",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("capability_id", sa.UUID(), nullable=True),
        sa.Column("calibration", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["capability_id"],
            ["capabilities.id"],
            name=op.f("fk_environments_capability_id_capabilities"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_environments_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint(
            "tenant_id", "name", "version", name=op.f("uq_environments_tenant_id_name_version")
        ),
    )
    op.create_index(op.f("ix_environments_tenant_id"), "environments", ["tenant_id"], unique=False)
    op.create_table(
        "tasks",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("environment_id", sa.UUID(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("split", sa.String(length=8), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_tasks_environment_id_environments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_tasks_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint(
            "tenant_id",
            "environment_id",
            "external_id",
            name=op.f("uq_tasks_tenant_id_environment_id_external_id"),
        ),
    )
    op.create_index(op.f("ix_tasks_tenant_id"), "tasks", ["tenant_id"], unique=False)
    op.create_index(
        op.f("ix_tasks_tenant_id_environment_id_split"),
        "tasks",
        ["tenant_id", "environment_id", "split"],
        unique=False,
    )
    op.create_table(
        "training_jobs",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("environment_id", sa.UUID(), nullable=False),
        sa.Column("capability_id", sa.UUID(), nullable=True),
        sa.Column("cycle_id", sa.UUID(), nullable=True),
        sa.Column("adapter_id", sa.UUID(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=True),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"],
            ["adapters.id"],
            name=op.f("fk_training_jobs_adapter_id_adapters"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["capability_id"],
            ["capabilities.id"],
            name=op.f("fk_training_jobs_capability_id_capabilities"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycles.id"],
            name=op.f("fk_training_jobs_cycle_id_cycles"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_training_jobs_environment_id_environments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_training_jobs_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_jobs")),
    )
    op.create_index(
        op.f("ix_training_jobs_tenant_id"), "training_jobs", ["tenant_id"], unique=False
    )
    op.create_index(
        op.f("ix_training_jobs_tenant_id_status"),
        "training_jobs",
        ["tenant_id", "status"],
        unique=False,
    )
    op.create_table(
        "trajectories",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("agent_id", sa.UUID(), nullable=False),
        sa.Column("request_id", sa.UUID(), nullable=True),
        sa.Column("cycle_id", sa.UUID(), nullable=True),
        sa.Column("task_id", sa.UUID(), nullable=True),
        sa.Column("environment_id", sa.UUID(), nullable=True),
        sa.Column("adapter_id", sa.UUID(), nullable=True),
        sa.Column("trial", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("messages", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("reward_breakdown", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(
            ["adapter_id"],
            ["adapters.id"],
            name=op.f("fk_trajectories_adapter_id_adapters"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_trajectories_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycles.id"],
            name=op.f("fk_trajectories_cycle_id_cycles"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_trajectories_environment_id_environments"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
            name=op.f("fk_trajectories_task_id_tasks"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_trajectories_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectories")),
        sa.UniqueConstraint(
            "tenant_id",
            "request_id",
            "task_id",
            "trial",
            name=op.f("uq_trajectories_tenant_id_request_id_task_id_trial"),
        ),
    )
    op.create_index(op.f("ix_trajectories_tenant_id"), "trajectories", ["tenant_id"], unique=False)
    op.create_index(
        op.f("ix_trajectories_tenant_id_agent_id_created_at"),
        "trajectories",
        ["tenant_id", "agent_id", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_trajectories_tenant_id_cycle_id"),
        "trajectories",
        ["tenant_id", "cycle_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_trajectories_tenant_id_cycle_id"), table_name="trajectories")
    op.drop_index(op.f("ix_trajectories_tenant_id_agent_id_created_at"), table_name="trajectories")
    op.drop_index(op.f("ix_trajectories_tenant_id"), table_name="trajectories")
    op.drop_table("trajectories")
    op.drop_index(op.f("ix_training_jobs_tenant_id_status"), table_name="training_jobs")
    op.drop_index(op.f("ix_training_jobs_tenant_id"), table_name="training_jobs")
    op.drop_table("training_jobs")
    op.drop_index(op.f("ix_tasks_tenant_id_environment_id_split"), table_name="tasks")
    op.drop_index(op.f("ix_tasks_tenant_id"), table_name="tasks")
    op.drop_table("tasks")
    op.drop_index(op.f("ix_environments_tenant_id"), table_name="environments")
    op.drop_table("environments")
    op.drop_index(op.f("ix_adapters_tenant_id"), table_name="adapters")
    op.drop_index(op.f("ix_adapters_agent_id"), table_name="adapters")
    op.drop_table("adapters")
    op.drop_index(op.f("ix_evaluations_tenant_id_cycle_id"), table_name="evaluations")
    op.drop_index(op.f("ix_evaluations_tenant_id"), table_name="evaluations")
    op.drop_table("evaluations")
    op.drop_index(op.f("ix_capabilities_tenant_id"), table_name="capabilities")
    op.drop_index(op.f("ix_capabilities_agent_id"), table_name="capabilities")
    op.drop_table("capabilities")
    op.drop_index(
        "uq_cycles_active_agent",
        table_name="cycles",
        postgresql_where=sa.text("state NOT IN ('completed', 'failed')"),
    )
    op.drop_index(op.f("ix_cycles_tenant_id"), table_name="cycles")
    op.drop_index(op.f("ix_cycles_agent_id"), table_name="cycles")
    op.drop_table("cycles")
    op.drop_index(op.f("ix_processed_messages_tenant_id"), table_name="processed_messages")
    op.drop_table("processed_messages")
    op.drop_index(op.f("ix_api_keys_tenant_id"), table_name="api_keys")
    op.drop_index(op.f("ix_api_keys_prefix"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_index(op.f("ix_agents_tenant_id"), table_name="agents")
    op.drop_table("agents")
    op.drop_table("tenants")
