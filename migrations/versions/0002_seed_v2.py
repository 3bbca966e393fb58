"""Seed schema v2: agent_id, queued owners, suspect leases, durable policy (migrateV1ToV2).

Revision ID: 0002_seed_v2
Revises: 0001_seed_v1
Create Date: 2026-12-02

turn_requests.parent_id becomes agent_id; turn_requests gains the queued-owner columns and
the partial index turn_requests_queued_owner; leases gains suspect_since and suspect_reason
(with its CHECK); policy_state and queued_owner_instances are created. On SQLite the seed's
DDL runs literally.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from admission_plane.migrate import (
    assert_drop_column_available,
    erase_ledger,
    execute_script,
    read_sqlite_version,
    record_ledger,
)

revision: str = "0002_seed_v2"
down_revision: str | None = "0001_seed_v1"
branch_labels: str | None = None
depends_on: str | None = None
#: The seed ledger version this revision writes (adoption maps a ledger version to its revision).
seed_ledger_version = 2

# Verbatim from the seed (migrateV1ToV2); do not reformat: SQLite stores this text.
SQLITE_DDL = """
      ALTER TABLE turn_requests RENAME COLUMN parent_id TO agent_id;
      ALTER TABLE turn_requests ADD COLUMN queued_owner_instance_id TEXT NULL;
      ALTER TABLE turn_requests ADD COLUMN queued_owner_recorded_at INTEGER NULL;
      CREATE INDEX IF NOT EXISTS turn_requests_queued_owner
        ON turn_requests(queued_owner_instance_id)
        WHERE queued_owner_instance_id IS NOT NULL;
      ALTER TABLE leases ADD COLUMN suspect_since INTEGER NULL;
      ALTER TABLE leases ADD COLUMN suspect_reason TEXT CHECK (suspect_reason IS NULL OR suspect_reason IN ('heartbeat_expired', 'identity_unverifiable'));
      CREATE TABLE policy_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        max_active_turns INTEGER NOT NULL CHECK (max_active_turns >= 1),
        max_concurrent_starts INTEGER NOT NULL CHECK (max_concurrent_starts >= 1),
        min_start_interval_ms INTEGER NOT NULL CHECK (min_start_interval_ms >= 2000),
        queue_timeout_ms INTEGER NOT NULL CHECK (queue_timeout_ms > 0 AND queue_timeout_ms <= 1800000),
        capacity_cooldown_ms INTEGER NOT NULL CHECK (capacity_cooldown_ms >= 30000),
        drain_state TEXT NOT NULL CHECK (drain_state IN ('steady', 'soft_draining_to_1')),
        policy_fingerprint TEXT NOT NULL,
        updated_at INTEGER NOT NULL,
        updated_by_owner_instance_id TEXT NOT NULL
      );
      CREATE TABLE queued_owner_instances (
        owner_instance_id TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        boot_id TEXT NOT NULL,
        pid INTEGER NOT NULL,
        start_time_ticks TEXT NOT NULL,
        pid_namespace_inode INTEGER NOT NULL,
        ppid INTEGER NOT NULL,
        pgrp INTEGER NOT NULL,
        session INTEGER NOT NULL,
        recorded_at INTEGER NOT NULL
      );
    """

# Reverse order of the upgrade; the partial index goes before the column it covers.
DOWNGRADE_DDL = """
DROP TABLE queued_owner_instances;
DROP TABLE policy_state;
DROP INDEX turn_requests_queued_owner;
ALTER TABLE leases DROP COLUMN suspect_reason;
ALTER TABLE leases DROP COLUMN suspect_since;
ALTER TABLE turn_requests DROP COLUMN queued_owner_recorded_at;
ALTER TABLE turn_requests DROP COLUMN queued_owner_instance_id;
ALTER TABLE turn_requests RENAME COLUMN agent_id TO parent_id
"""

BIGINT = sa.BigInteger()


def upgrade() -> None:
    """Apply the seed's v1 -> v2 changes and ledger row 2."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, SQLITE_DDL)
    else:
        _upgrade_postgresql()
    record_ledger(bind, 2)


def downgrade() -> None:
    """Undo the v2 changes (agent_id back to parent_id, values kept) and delete ledger row 2."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        assert_drop_column_available(read_sqlite_version(bind))
    execute_script(bind, DOWNGRADE_DDL)
    erase_ledger(bind, 2)


def _upgrade_postgresql() -> None:
    op.alter_column("turn_requests", "parent_id", new_column_name="agent_id")
    op.add_column("turn_requests", sa.Column("queued_owner_instance_id", sa.Text(), nullable=True))
    op.add_column("turn_requests", sa.Column("queued_owner_recorded_at", BIGINT, nullable=True))
    op.create_index(
        "turn_requests_queued_owner",
        "turn_requests",
        ["queued_owner_instance_id"],
        postgresql_where=sa.text("queued_owner_instance_id IS NOT NULL"),
    )
    op.add_column("leases", sa.Column("suspect_since", BIGINT, nullable=True))
    op.add_column("leases", sa.Column("suspect_reason", sa.Text(), nullable=True))
    op.create_check_constraint(
        "leases_suspect_reason_check",
        "leases",
        "suspect_reason IS NULL OR suspect_reason IN ('heartbeat_expired', 'identity_unverifiable')",
    )
    op.create_table(
        "policy_state",
        sa.Column("id", BIGINT, autoincrement=False, nullable=False),
        sa.Column("max_active_turns", BIGINT, nullable=False),
        sa.Column("max_concurrent_starts", BIGINT, nullable=False),
        sa.Column("min_start_interval_ms", BIGINT, nullable=False),
        sa.Column("queue_timeout_ms", BIGINT, nullable=False),
        sa.Column("capacity_cooldown_ms", BIGINT, nullable=False),
        sa.Column("drain_state", sa.Text(), nullable=False),
        sa.Column("policy_fingerprint", sa.Text(), nullable=False),
        sa.Column("updated_at", BIGINT, nullable=False),
        sa.Column("updated_by_owner_instance_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="policy_state_pkey"),
        sa.CheckConstraint("id = 1", name="policy_state_id_check"),
        sa.CheckConstraint("max_active_turns >= 1", name="policy_state_max_active_turns_check"),
        sa.CheckConstraint("max_concurrent_starts >= 1", name="policy_state_max_concurrent_starts_check"),
        sa.CheckConstraint("min_start_interval_ms >= 2000", name="policy_state_min_start_interval_ms_check"),
        sa.CheckConstraint(
            "queue_timeout_ms > 0 AND queue_timeout_ms <= 1800000", name="policy_state_queue_timeout_ms_check"
        ),
        sa.CheckConstraint("capacity_cooldown_ms >= 30000", name="policy_state_capacity_cooldown_ms_check"),
        sa.CheckConstraint("drain_state IN ('steady', 'soft_draining_to_1')", name="policy_state_drain_state_check"),
    )
    op.create_table(
        "queued_owner_instances",
        sa.Column("owner_instance_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("boot_id", sa.Text(), nullable=False),
        sa.Column("pid", BIGINT, nullable=False),
        sa.Column("start_time_ticks", sa.Text(), nullable=False),
        sa.Column("pid_namespace_inode", BIGINT, nullable=False),
        sa.Column("ppid", BIGINT, nullable=False),
        sa.Column("pgrp", BIGINT, nullable=False),
        sa.Column("session", BIGINT, nullable=False),
        sa.Column("recorded_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("owner_instance_id", name="queued_owner_instances_pkey"),
    )
