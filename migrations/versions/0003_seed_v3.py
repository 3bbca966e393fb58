"""Seed schema v3: policy_state rebuilt with the relaxed seat and start CHECKs (migrateV2ToV3).

Revision ID: 0003_seed_v3
Revises: 0002_seed_v2
Create Date: 2026-12-02

SQLite cannot alter a CHECK, so the seed builds policy_state_v3, copies the rows verbatim,
drops the old table and renames the new one: a v2 table written by the original 2.0.x
(max_active_turns IN (1, 3), max_concurrent_starts = 1) comes out with the >= 1 checks and
its durable row intact. PostgreSQL drops and re-adds the two constraints instead.
"""

from __future__ import annotations

from alembic import op

from admission_plane.migrate import erase_ledger, execute_script, record_ledger

revision: str = "0003_seed_v3"
down_revision: str | None = "0002_seed_v2"
branch_labels: str | None = None
depends_on: str | None = None
#: The seed ledger version this revision writes (adoption maps a ledger version to its revision).
seed_ledger_version = 3

# Verbatim from the seed (migrateV2ToV3); do not reformat: SQLite stores this text.
SQLITE_DDL = """
      CREATE TABLE policy_state_v3 (
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
      INSERT INTO policy_state_v3 SELECT * FROM policy_state;
      DROP TABLE policy_state;
      ALTER TABLE policy_state_v3 RENAME TO policy_state;
    """

# The downgrade restores the seed's v2 table text exactly (a rename would quote the name).
SQLITE_DOWNGRADE_DDL = """
      CREATE TEMP TABLE policy_state_downgrade AS SELECT * FROM policy_state;
      DROP TABLE policy_state;
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
      INSERT INTO policy_state SELECT * FROM policy_state_downgrade;
      DROP TABLE policy_state_downgrade;
"""

RELAXED_CHECKS = (
    ("policy_state_max_active_turns_check", "max_active_turns >= 1"),
    ("policy_state_max_concurrent_starts_check", "max_concurrent_starts >= 1"),
)


def upgrade() -> None:
    """Rebuild policy_state with the relaxed CHECKs (rows kept) and add ledger row 3."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, SQLITE_DDL)
    else:
        _replace_postgresql_checks()
    record_ledger(bind, 3)


def downgrade() -> None:
    """Restore the seed's v2 policy_state (same CHECKs, rows kept) and delete ledger row 3."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, SQLITE_DOWNGRADE_DDL)
    else:
        _replace_postgresql_checks()
    erase_ledger(bind, 3)


def _replace_postgresql_checks() -> None:
    for name, condition in RELAXED_CHECKS:
        op.drop_constraint(name, "policy_state", type_="check")
        op.create_check_constraint(name, "policy_state", condition)
