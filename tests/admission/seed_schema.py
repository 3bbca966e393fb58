# ruff: noqa: E501  (the seed's DDL is quoted verbatim, long lines included)
"""Seed databases built the way the original connector built them, for adoption and parity tests.

The DDL below is copied verbatim from the seed (``createInitialV1Schema``, ``migrateV1ToV2``,
``migrateV2ToV3``) and executed literally with the standard-library ``sqlite3`` module, one
``BEGIN ... COMMIT`` script per version as better-sqlite3's ``exec`` ran it. It is kept apart
from ``migrations/`` on purpose: it is the oracle the Alembic history is compared with.
``STRICT_V2_DDL`` is the 2.0.x variant of v2 (``max_active_turns IN (1, 3)``,
``max_concurrent_starts = 1``).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

SEED_V1_DDL = """
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

SEED_V2_DDL = """
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

STRICT_V2_DDL = """
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
        max_active_turns INTEGER NOT NULL CHECK (max_active_turns IN (1, 3)),
        max_concurrent_starts INTEGER NOT NULL CHECK (max_concurrent_starts = 1),
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

SEED_V3_DDL = """
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

LEDGER = {1: "shared-admission-queue", 2: "shared-admission-queue-v2", 3: "shared-admission-queue-v3"}
APPLIED_AT = {1: 1_700_000_000_001, 2: 1_700_000_000_002, 3: 1_700_000_000_003}
LEASE_ID = "0b0f6f4e-8d1c-4c35-9a55-2f1f4c8e7a10"
OWNER_ID = "5f2d8c1e-3b4a-4d6e-8f70-1a2b3c4d5e6f"

#: One or more rows for every admission table, in their v3 shape.
ROWS: dict[str, list[dict[str, Any]]] = {
    "turn_requests": [
        {
            "request_id": "r-active",
            "session_id": "s1",
            "agent_id": "agent-a",
            "fingerprint": "f1",
            "provider": "antigravity",
            "model": "m1",
            "state": "active",
            "enqueued_at": 1_700_000_000_000,
            "deadline_at": 1_700_001_800_000,
            "lease_generation": 1,
            "terminal_at": None,
            "queued_owner_instance_id": OWNER_ID,
            "queued_owner_recorded_at": 1_700_000_000_010,
        },
        {
            "request_id": "r-queued",
            "session_id": "s1",
            "agent_id": "agent-b",
            "fingerprint": "f2",
            "provider": "antigravity",
            "model": "m1",
            "state": "queued",
            "enqueued_at": 1_700_000_000_100,
            "deadline_at": 1_700_001_800_100,
            "lease_generation": 0,
            "terminal_at": None,
            "queued_owner_instance_id": None,
            "queued_owner_recorded_at": None,
        },
        {
            "request_id": "r-done",
            "session_id": "s2",
            "agent_id": "agent-é",
            "fingerprint": "f3",
            "provider": "antigravity",
            "model": "m2",
            "state": "completed",
            "enqueued_at": 1_699_999_000_000,
            "deadline_at": 1_700_000_800_000,
            "lease_generation": 2,
            "terminal_at": 1_699_999_500_000,
            "queued_owner_instance_id": None,
            "queued_owner_recorded_at": None,
        },
    ],
    "leases": [
        {
            "lease_id": LEASE_ID,
            "request_id": "r-active",
            "generation": 1,
            "owner_instance_id": "owner-1",
            "phase": "active",
            "acquired_at": 1_700_000_000_200,
            "heartbeat_at": 1_700_000_000_900,
            "suspect_since": 1_700_000_000_950,
            "suspect_reason": "heartbeat_expired",
        },
    ],
    "cooldowns": [
        {"provider": "antigravity", "model": "m1", "not_before": 1_700_000_030_000, "updated_at": 1_700_000_000_000},
    ],
    "turn_payloads": [
        {
            "request_id": "r-queued",
            "nonce": bytes(range(12)),
            "ciphertext": bytes.fromhex("d3c3f94a4f"),
            "auth_tag": bytes.fromhex("2475e28bb0772b3e4f2adc9fc16cc821"),
            "key_version": 1,
            "content_fingerprint": "7a6e3af05ab4a90caad0f68e1280e92ad72defacd48cf5ee076f05dc4b7591ba",
            "expires_at": 1_700_001_800_100,
            "created_at": 1_700_000_000_100,
        },
    ],
    "lease_process_identities": [
        {
            "lease_id": LEASE_ID,
            "request_id": "r-active",
            "lease_generation": 1,
            "owner_instance_id": "owner-1",
            "prompt_channel": "stdin",
            "connector_owner_instance_id": OWNER_ID,
            "connector_created_at": "2023-11-14T22:13:20.000Z",
            "connector_boot_id": "0123abcd-0000-4000-8000-00000000beef",
            "connector_pid": 4242,
            "connector_start_time_ticks": "18446744073709551615",
            "connector_pid_namespace_inode": 4_026_531_836,
            "connector_ppid": 1,
            "connector_pgrp": 4242,
            "connector_session": 4242,
            "child_boot_id": "0123abcd-0000-4000-8000-00000000beef",
            "child_pid": 4243,
            "child_start_time_ticks": "987654",
            "child_pid_namespace_inode": 4_026_531_836,
            "child_ppid": 4242,
            "child_pgrp": 4243,
            "child_session": 4243,
            "recorded_at": 1_700_000_000_300,
        },
    ],
    "start_history": [{"lease_id": LEASE_ID, "started_at": 1_700_000_000_250}],
    "sessions": [
        {
            "session_id": "s1",
            "conversation_id": None,
            "conversation_cursor": 0,
            "model": "m1",
            "effort": "high",
            "mode": "agent",
            "cwd": "/work",
            "roots_json": '["/work"]',
            "v2_user_message_ids_json": "[]",
            "updated_at": 1_700_000_000_000,
        },
    ],
    "events": [
        {
            "event_seq": 1,
            "kind": "enqueued",
            "from_state": "none",
            "to_state": "queued",
            "occurred_at": 1_700_000_000_000,
            "correlation_hmac": "dd68e8f75598f7318cac9c6a72bfd6af38522a7d047d63d7d07a6738434ff906",
        },
        {
            "event_seq": 2,
            "kind": "admitted",
            "from_state": "queued",
            "to_state": "admitted",
            "occurred_at": 1_700_000_000_200,
            "correlation_hmac": "dd68e8f75598f7318cac9c6a72bfd6af38522a7d047d63d7d07a6738434ff906",
        },
    ],
    "policy_state": [
        {
            "id": 1,
            "max_active_turns": 3,
            "max_concurrent_starts": 1,
            "min_start_interval_ms": 2000,
            "queue_timeout_ms": 1_800_000,
            "capacity_cooldown_ms": 30_000,
            "drain_state": "steady",
            "policy_fingerprint": "8d5d973734f4523801a9ad7909e374fe12e23bae54b0fc868e0af67e083b672f",
            "updated_at": 1_700_000_000_000,
            "updated_by_owner_instance_id": "owner-1",
        },
    ],
    "queued_owner_instances": [
        {
            "owner_instance_id": OWNER_ID,
            "created_at": "2023-11-14T22:13:20.000Z",
            "boot_id": "0123abcd-0000-4000-8000-00000000beef",
            "pid": 4242,
            "start_time_ticks": "123456",
            "pid_namespace_inode": 4_026_531_836,
            "ppid": 1,
            "pgrp": 4242,
            "session": 4242,
            "recorded_at": 1_700_000_000_010,
        },
    ],
}

#: What v2 added: whole tables, and columns of v1 tables.
V2_TABLES = ("policy_state", "queued_owner_instances")
V2_COLUMNS = {
    "turn_requests": ("queued_owner_instance_id", "queued_owner_recorded_at"),
    "leases": ("suspect_since", "suspect_reason"),
}


def connect(path: Path) -> sqlite3.Connection:
    """An autocommit ``sqlite3`` connection with foreign keys on (as the seed's connector opened it)."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


def build_seed_database(path: Path, version: int, *, strict_v2: bool = False) -> Path:
    """Create ``path`` at seed schema ``version`` (1-3) by executing the seed's DDL literally."""
    scripts = (SEED_V1_DDL, STRICT_V2_DDL if strict_v2 else SEED_V2_DDL, SEED_V3_DDL)[:version]
    with closing(connect(path)) as connection:
        for number, script in enumerate(scripts, start=1):
            connection.executescript(
                f"BEGIN;{script};"
                f"INSERT INTO schema_migrations (version, name, applied_at) "
                f"VALUES ({number}, '{LEDGER[number]}', {APPLIED_AT[number]});"
                "COMMIT;"
            )
    return path


def tables_at(version: int) -> list[str]:
    """The admission tables (ledger excluded) that exist at seed ``version``."""
    return [table for table in ROWS if version >= 2 or table not in V2_TABLES]


def populate(path: Path, version: int) -> None:
    """Insert :data:`ROWS` into a database at seed ``version``, in that version's column shape."""
    with closing(connect(path)) as connection:
        connection.execute("BEGIN")
        for table in tables_at(version):
            for row in ROWS[table]:
                shaped = _shape(table, row, version)
                columns = ", ".join(shaped)
                marks = ", ".join("?" for _ in shaped)
                connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(shaped.values()))
        connection.execute("COMMIT")


def _shape(table: str, row: dict[str, Any], version: int) -> dict[str, Any]:
    if version >= 2:
        return dict(row)
    shaped = {key: value for key, value in row.items() if key not in V2_COLUMNS.get(table, ())}
    if table == "turn_requests":
        shaped = {("parent_id" if key == "agent_id" else key): value for key, value in shaped.items()}
    return shaped


def expected_rows_after_upgrade(version: int) -> dict[str, list[dict[str, Any]]]:
    """The rows of every v3 table after upgrading a database populated at ``version`` (v2 additions empty from v1)."""
    expected: dict[str, list[dict[str, Any]]] = {table: [] for table in ROWS}
    for table in tables_at(version):
        rows = []
        for row in ROWS[table]:
            added = V2_COLUMNS.get(table, ()) if version == 1 else ()
            rows.append({key: (None if key in added else value) for key, value in row.items()})
        expected[table] = sorted(rows, key=_row_key)
    return expected


def _row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(repr(value) for value in row.values())


def snapshot(path: Path, tables: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every row of ``tables`` (default: all admission tables present), as dicts in a stable order."""
    with closing(connect(path)) as connection:
        connection.row_factory = sqlite3.Row
        present = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        names = tables if tables is not None else [table for table in ROWS if table in present]
        return {
            table: sorted((dict(row) for row in connection.execute(f"SELECT * FROM {table}")), key=_row_key)
            for table in names
        }


def ledger(path: Path) -> list[tuple[int, str, int]]:
    """The ``schema_migrations`` rows, in version order."""
    with closing(connect(path)) as connection:
        return list(connection.execute("SELECT version, name, applied_at FROM schema_migrations ORDER BY version"))


def master_sql(path: Path) -> dict[tuple[str, str], str | None]:
    """``(type, name) -> sql`` of every schema object outside ``sqlite_%`` and Alembic's version table."""
    with closing(connect(path)) as connection:
        return {
            (kind, name): sql
            for kind, name, sql in connection.execute("SELECT type, name, sql FROM sqlite_master")
            if not name.startswith("sqlite_") and "alembic_version" not in name
        }


#: The columns our revisions after v3 add to the seed's tables, with the value every adopted row holds there:
#: 0004's ``host_id`` (NULL: written on this host), 0006's ``lane`` (the default lane) and ``revision`` (no live
#: policy revision yet).
OUR_COLUMNS: dict[str, dict[str, object]] = {
    "turn_requests": {"lane": "default"},
    "lease_process_identities": {"host_id": None},
    "queued_owner_instances": {"host_id": None},
    "policy_state": {"revision": 0},
}


def without_our_columns(rows: dict[str, list[dict[str, object]]]) -> dict[str, list[dict[str, object]]]:
    """Drop the columns of :data:`OUR_COLUMNS` after checking that every adopted row holds their adoption value."""
    stripped = {}
    for table, table_rows in rows.items():
        added = OUR_COLUMNS.get(table, {})
        stripped[table] = []
        for row in table_rows:
            for column, value in added.items():
                if column in row:
                    assert row[column] == value, (table, column, row[column])
            stripped[table].append({key: value for key, value in row.items() if key not in added})
    return stripped
