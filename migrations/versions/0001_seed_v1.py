"""Seed schema v1: the original connector's initial tables (createInitialV1Schema).

Revision ID: 0001_seed_v1
Revises: (none)
Create Date: 2026-12-02

On SQLite the seed's DDL runs literally, so sqlite_master.sql is byte-identical to a
database the original connector created. PostgreSQL gets the same tables, columns,
constraints and index names with BIGINT integers, BYTEA blobs and an identity event_seq.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from admission_plane.migrate import execute_script, record_ledger

revision: str = "0001_seed_v1"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None
#: The seed ledger version this revision writes (adoption maps a ledger version to its revision).
seed_ledger_version = 1

# Verbatim from the seed (createInitialV1Schema); do not reformat: SQLite stores this text.
SQLITE_DDL = """
      CREATE TABLE schema_migrations (
        version INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        applied_at INTEGER NOT NULL
      );
      CREATE TABLE turn_requests (
        request_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        parent_id TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        state TEXT NOT NULL,
        enqueued_at INTEGER NOT NULL,
        deadline_at INTEGER NOT NULL,
        lease_generation INTEGER NOT NULL DEFAULT 0,
        terminal_at INTEGER
      );
      CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE REFERENCES turn_requests(request_id),
        generation INTEGER NOT NULL,
        owner_instance_id TEXT NOT NULL,
        phase TEXT NOT NULL,
        acquired_at INTEGER NOT NULL,
        heartbeat_at INTEGER NOT NULL
      );
      CREATE TABLE cooldowns (
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        not_before INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (provider, model)
      );
      CREATE TABLE turn_payloads (
        request_id TEXT PRIMARY KEY REFERENCES turn_requests(request_id) ON DELETE CASCADE,
        nonce BLOB NOT NULL,
        ciphertext BLOB NOT NULL,
        auth_tag BLOB NOT NULL,
        key_version INTEGER NOT NULL,
        content_fingerprint TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL
      );
      CREATE TABLE lease_process_identities (
        lease_id TEXT PRIMARY KEY REFERENCES leases(lease_id) ON DELETE CASCADE,
        request_id TEXT NOT NULL REFERENCES turn_requests(request_id),
        lease_generation INTEGER NOT NULL,
        owner_instance_id TEXT NOT NULL,
        prompt_channel TEXT NOT NULL,
        connector_owner_instance_id TEXT NOT NULL,
        connector_created_at TEXT NOT NULL,
        connector_boot_id TEXT NOT NULL,
        connector_pid INTEGER NOT NULL,
        connector_start_time_ticks TEXT NOT NULL,
        connector_pid_namespace_inode INTEGER NOT NULL,
        connector_ppid INTEGER NOT NULL,
        connector_pgrp INTEGER NOT NULL,
        connector_session INTEGER NOT NULL,
        child_boot_id TEXT NOT NULL,
        child_pid INTEGER NOT NULL,
        child_start_time_ticks TEXT NOT NULL,
        child_pid_namespace_inode INTEGER NOT NULL,
        child_ppid INTEGER NOT NULL,
        child_pgrp INTEGER NOT NULL,
        child_session INTEGER NOT NULL,
        recorded_at INTEGER NOT NULL
      );
      CREATE TABLE start_history (
        lease_id TEXT PRIMARY KEY,
        started_at INTEGER NOT NULL
      );
      CREATE TABLE sessions (
        session_id TEXT NOT NULL PRIMARY KEY,
        conversation_id TEXT,
        conversation_cursor INTEGER NOT NULL,
        model TEXT NOT NULL,
        effort TEXT NOT NULL,
        mode TEXT NOT NULL,
        cwd TEXT NOT NULL,
        roots_json TEXT NOT NULL,
        v2_user_message_ids_json TEXT NOT NULL,
        updated_at INTEGER NOT NULL
      );
      CREATE TABLE events (
        event_seq INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state TEXT NOT NULL,
        occurred_at INTEGER NOT NULL,
        correlation_hmac TEXT NOT NULL
      );
      CREATE INDEX turn_requests_queue ON turn_requests(state, enqueued_at);
      CREATE INDEX leases_phase ON leases(phase);
      CREATE UNIQUE INDEX lease_process_identities_request ON lease_process_identities(request_id);
      CREATE INDEX start_history_started ON start_history(started_at);
      CREATE INDEX sessions_updated_at_session_id ON sessions(updated_at DESC, session_id ASC);
      CREATE INDEX sessions_cwd_updated_at_session_id ON sessions(cwd, updated_at DESC, session_id ASC);
      CREATE INDEX events_occurred ON events(occurred_at, event_seq);
    """

BIGINT = sa.BigInteger()

# Children first: foreign keys are enforced while the tables are dropped.
V1_TABLES_DROP_ORDER = (
    "lease_process_identities",
    "turn_payloads",
    "leases",
    "turn_requests",
    "cooldowns",
    "start_history",
    "sessions",
    "events",
    "schema_migrations",
)


def upgrade() -> None:
    """Create the seed's v1 tables and indexes and ledger row 1."""
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        execute_script(bind, SQLITE_DDL)
    else:
        _create_postgresql_tables()
    record_ledger(bind, 1)


def downgrade() -> None:
    """Drop every v1 table (their indexes go with them), the ledger included."""
    for table in V1_TABLES_DROP_ORDER:
        op.drop_table(table)


def _create_postgresql_tables() -> None:
    op.create_table(
        "schema_migrations",
        sa.Column("version", BIGINT, autoincrement=False, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("applied_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("version", name="schema_migrations_pkey"),
    )
    op.create_table(
        "turn_requests",
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("enqueued_at", BIGINT, nullable=False),
        sa.Column("deadline_at", BIGINT, nullable=False),
        sa.Column("lease_generation", BIGINT, server_default=sa.text("0"), nullable=False),
        sa.Column("terminal_at", BIGINT, nullable=True),
        sa.PrimaryKeyConstraint("request_id", name="turn_requests_pkey"),
    )
    op.create_table(
        "leases",
        sa.Column("lease_id", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("generation", BIGINT, nullable=False),
        sa.Column("owner_instance_id", sa.Text(), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("acquired_at", BIGINT, nullable=False),
        sa.Column("heartbeat_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("lease_id", name="leases_pkey"),
        sa.UniqueConstraint("request_id", name="leases_request_id_key"),
        sa.ForeignKeyConstraint(["request_id"], ["turn_requests.request_id"], name="leases_request_id_fkey"),
    )
    op.create_table(
        "cooldowns",
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("not_before", BIGINT, nullable=False),
        sa.Column("updated_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("provider", "model", name="cooldowns_pkey"),
    )
    op.create_table(
        "turn_payloads",
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("auth_tag", sa.LargeBinary(), nullable=False),
        sa.Column("key_version", BIGINT, nullable=False),
        sa.Column("content_fingerprint", sa.Text(), nullable=False),
        sa.Column("expires_at", BIGINT, nullable=False),
        sa.Column("created_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="turn_payloads_pkey"),
        sa.ForeignKeyConstraint(
            ["request_id"], ["turn_requests.request_id"], name="turn_payloads_request_id_fkey", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "lease_process_identities",
        sa.Column("lease_id", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("lease_generation", BIGINT, nullable=False),
        sa.Column("owner_instance_id", sa.Text(), nullable=False),
        sa.Column("prompt_channel", sa.Text(), nullable=False),
        sa.Column("connector_owner_instance_id", sa.Text(), nullable=False),
        sa.Column("connector_created_at", sa.Text(), nullable=False),
        sa.Column("connector_boot_id", sa.Text(), nullable=False),
        sa.Column("connector_pid", BIGINT, nullable=False),
        sa.Column("connector_start_time_ticks", sa.Text(), nullable=False),
        sa.Column("connector_pid_namespace_inode", BIGINT, nullable=False),
        sa.Column("connector_ppid", BIGINT, nullable=False),
        sa.Column("connector_pgrp", BIGINT, nullable=False),
        sa.Column("connector_session", BIGINT, nullable=False),
        sa.Column("child_boot_id", sa.Text(), nullable=False),
        sa.Column("child_pid", BIGINT, nullable=False),
        sa.Column("child_start_time_ticks", sa.Text(), nullable=False),
        sa.Column("child_pid_namespace_inode", BIGINT, nullable=False),
        sa.Column("child_ppid", BIGINT, nullable=False),
        sa.Column("child_pgrp", BIGINT, nullable=False),
        sa.Column("child_session", BIGINT, nullable=False),
        sa.Column("recorded_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("lease_id", name="lease_process_identities_pkey"),
        sa.ForeignKeyConstraint(
            ["lease_id"], ["leases.lease_id"], name="lease_process_identities_lease_id_fkey", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["request_id"], ["turn_requests.request_id"], name="lease_process_identities_request_id_fkey"
        ),
    )
    op.create_table(
        "start_history",
        sa.Column("lease_id", sa.Text(), nullable=False),
        sa.Column("started_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("lease_id", name="start_history_pkey"),
    )
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), nullable=True),
        sa.Column("conversation_cursor", BIGINT, nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("effort", sa.Text(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=False),
        sa.Column("roots_json", sa.Text(), nullable=False),
        sa.Column("v2_user_message_ids_json", sa.Text(), nullable=False),
        sa.Column("updated_at", BIGINT, nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="sessions_pkey"),
    )
    op.create_table(
        "events",
        sa.Column("event_seq", BIGINT, sa.Identity(always=False), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=False),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("occurred_at", BIGINT, nullable=False),
        sa.Column("correlation_hmac", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("event_seq", name="events_pkey"),
    )
    op.create_index("turn_requests_queue", "turn_requests", ["state", "enqueued_at"])
    op.create_index("leases_phase", "leases", ["phase"])
    op.create_index("lease_process_identities_request", "lease_process_identities", ["request_id"], unique=True)
    op.create_index("start_history_started", "start_history", ["started_at"])
    op.create_index("sessions_updated_at_session_id", "sessions", [sa.text("updated_at DESC"), "session_id"])
    op.create_index("sessions_cwd_updated_at_session_id", "sessions", ["cwd", sa.text("updated_at DESC"), "session_id"])
    op.create_index("events_occurred", "events", ["occurred_at", "event_seq"])
