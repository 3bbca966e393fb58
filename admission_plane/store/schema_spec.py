"""The schema a live database must have, as data: the original's v3 schema and our revisions after it.

:mod:`admission_plane.store.schema_check` compares a database with it. Names, declared
SQLite types, keys, defaults, indexes, foreign keys and CHECKs are the original
connector's, exactly; :data:`EXTENSIONS` lists what our own revisions add.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import SchemaIntegrityError

__all__ = [
    "CHECKS",
    "EXPECTED_REVISION",
    "EXTENSIONS",
    "FOREIGN_KEYS",
    "INDEXES",
    "LEDGER",
    "SEED_REVISION",
    "TABLES",
    "UNIQUE_CONSTRAINTS",
    "VERSION_TABLE",
    "Check",
    "Column",
    "Extension",
    "ForeignKey",
    "Index",
    "Spec",
    "expected_schema_version",
    "expected_spec",
    "foreign_tables",
]


@dataclass(frozen=True)
class Column:
    """One column as SQLite declares it (PostgreSQL: INTEGER is bigint, BLOB is bytea, a key is NOT NULL)."""

    name: str
    type: str
    notnull: bool = False
    pk: int = 0
    default: str | None = None
    identity: bool = False
    #: The default as PostgreSQL's catalogue prints it, where it differs (``'x'::text``).
    pg_default: str | None = None


def _columns(*specs: str) -> tuple[Column, ...]:
    """``"name TYPE [PK|PKn] [NN] [DEFAULT v] [IDENTITY]"`` -> :class:`Column` (reads like the DDL)."""
    parsed = []
    for spec in specs:
        name, type_, *flags = spec.split()
        pk = next((int(flag[2:] or 1) for flag in flags if flag.startswith("PK")), 0)
        default = flags[flags.index("DEFAULT") + 1] if "DEFAULT" in flags else None
        pg_default = f"{default}::text" if type_ == "TEXT" and default is not None else None
        parsed.append(Column(name, type_, "NN" in flags, pk, default, "IDENTITY" in flags, pg_default))
    return tuple(parsed)


@dataclass(frozen=True)
class Index:
    """A named index: key columns in order (``"col DESC"`` for descending), uniqueness, partial predicate."""

    name: str
    table: str
    columns: tuple[str, ...]
    unique: bool = False
    where: str | None = None
    pg_where: str | None = None


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key of ``table``; ``on_delete`` as SQLite spells it."""

    table: str
    columns: tuple[str, ...]
    target: str
    target_columns: tuple[str, ...]
    on_delete: str = "NO ACTION"


@dataclass(frozen=True)
class Check:
    """A CHECK: the fragment the SQLite table SQL must contain, and the PostgreSQL constraint it is."""

    table: str
    sqlite_fragment: str
    pg_name: str | None = None
    pg_definition: str | None = None


TABLES: dict[str, tuple[Column, ...]] = {
    "schema_migrations": _columns("version INTEGER PK", "name TEXT NN", "applied_at INTEGER NN"),
    "turn_requests": _columns(
        "request_id TEXT PK",
        "session_id TEXT NN",
        "agent_id TEXT NN",
        "fingerprint TEXT NN",
        "provider TEXT NN",
        "model TEXT NN",
        "state TEXT NN",
        "enqueued_at INTEGER NN",
        "deadline_at INTEGER NN",
        "lease_generation INTEGER NN DEFAULT 0",
        "terminal_at INTEGER",
        "queued_owner_instance_id TEXT",
        "queued_owner_recorded_at INTEGER",
    ),
    "leases": _columns(
        "lease_id TEXT PK",
        "request_id TEXT NN",
        "generation INTEGER NN",
        "owner_instance_id TEXT NN",
        "phase TEXT NN",
        "acquired_at INTEGER NN",
        "heartbeat_at INTEGER NN",
        "suspect_since INTEGER",
        "suspect_reason TEXT",
    ),
    "cooldowns": _columns(
        "provider TEXT NN PK1", "model TEXT NN PK2", "not_before INTEGER NN", "updated_at INTEGER NN"
    ),
    "turn_payloads": _columns(
        "request_id TEXT PK",
        "nonce BLOB NN",
        "ciphertext BLOB NN",
        "auth_tag BLOB NN",
        "key_version INTEGER NN",
        "content_fingerprint TEXT NN",
        "expires_at INTEGER NN",
        "created_at INTEGER NN",
    ),
    "lease_process_identities": _columns(
        "lease_id TEXT PK",
        "request_id TEXT NN",
        "lease_generation INTEGER NN",
        "owner_instance_id TEXT NN",
        "prompt_channel TEXT NN",
        "connector_owner_instance_id TEXT NN",
        "connector_created_at TEXT NN",
        "connector_boot_id TEXT NN",
        "connector_pid INTEGER NN",
        "connector_start_time_ticks TEXT NN",
        "connector_pid_namespace_inode INTEGER NN",
        "connector_ppid INTEGER NN",
        "connector_pgrp INTEGER NN",
        "connector_session INTEGER NN",
        "child_boot_id TEXT NN",
        "child_pid INTEGER NN",
        "child_start_time_ticks TEXT NN",
        "child_pid_namespace_inode INTEGER NN",
        "child_ppid INTEGER NN",
        "child_pgrp INTEGER NN",
        "child_session INTEGER NN",
        "recorded_at INTEGER NN",
    ),
    "start_history": _columns("lease_id TEXT PK", "started_at INTEGER NN"),
    "sessions": _columns(
        "session_id TEXT NN PK",
        "conversation_id TEXT",
        "conversation_cursor INTEGER NN",
        "model TEXT NN",
        "effort TEXT NN",
        "mode TEXT NN",
        "cwd TEXT NN",
        "roots_json TEXT NN",
        "v2_user_message_ids_json TEXT NN",
        "updated_at INTEGER NN",
    ),
    "events": _columns(
        "event_seq INTEGER PK IDENTITY",
        "kind TEXT NN",
        "from_state TEXT NN",
        "to_state TEXT NN",
        "occurred_at INTEGER NN",
        "correlation_hmac TEXT NN",
    ),
    "policy_state": _columns(
        "id INTEGER PK",
        "max_active_turns INTEGER NN",
        "max_concurrent_starts INTEGER NN",
        "min_start_interval_ms INTEGER NN",
        "queue_timeout_ms INTEGER NN",
        "capacity_cooldown_ms INTEGER NN",
        "drain_state TEXT NN",
        "policy_fingerprint TEXT NN",
        "updated_at INTEGER NN",
        "updated_by_owner_instance_id TEXT NN",
    ),
    "queued_owner_instances": _columns(
        "owner_instance_id TEXT PK",
        "created_at TEXT NN",
        "boot_id TEXT NN",
        "pid INTEGER NN",
        "start_time_ticks TEXT NN",
        "pid_namespace_inode INTEGER NN",
        "ppid INTEGER NN",
        "pgrp INTEGER NN",
        "session INTEGER NN",
        "recorded_at INTEGER NN",
    ),
}

INDEXES: tuple[Index, ...] = (
    Index("turn_requests_queue", "turn_requests", ("state", "enqueued_at")),
    Index(
        "turn_requests_queued_owner",
        "turn_requests",
        ("queued_owner_instance_id",),
        where="queued_owner_instance_id IS NOT NULL",
    ),
    Index("leases_phase", "leases", ("phase",)),
    Index("lease_process_identities_request", "lease_process_identities", ("request_id",), unique=True),
    Index("start_history_started", "start_history", ("started_at",)),
    Index("sessions_updated_at_session_id", "sessions", ("updated_at DESC", "session_id")),
    Index("sessions_cwd_updated_at_session_id", "sessions", ("cwd", "updated_at DESC", "session_id")),
    Index("events_occurred", "events", ("occurred_at", "event_seq")),
)

FOREIGN_KEYS: tuple[ForeignKey, ...] = (
    ForeignKey("leases", ("request_id",), "turn_requests", ("request_id",)),
    ForeignKey("turn_payloads", ("request_id",), "turn_requests", ("request_id",), "CASCADE"),
    ForeignKey("lease_process_identities", ("lease_id",), "leases", ("lease_id",), "CASCADE"),
    ForeignKey("lease_process_identities", ("request_id",), "turn_requests", ("request_id",)),
)

#: UNIQUE constraints (not indexes): SQLite's ``sqlite_autoindex`` of origin ``u``.
UNIQUE_CONSTRAINTS: tuple[tuple[str, tuple[str, ...]], ...] = (("leases", ("request_id",)),)

CHECKS: tuple[Check, ...] = (
    Check(
        "leases",
        "suspect_reason TEXT CHECK (suspect_reason IS NULL OR suspect_reason IN "
        "('heartbeat_expired', 'identity_unverifiable'))",
        "leases_suspect_reason_check",
        "CHECK (((suspect_reason IS NULL) OR (suspect_reason = ANY "
        "(ARRAY['heartbeat_expired'::text, 'identity_unverifiable'::text]))))",
    ),
    Check("events", "event_seq INTEGER PRIMARY KEY AUTOINCREMENT"),
    Check("policy_state", "id INTEGER PRIMARY KEY CHECK (id = 1)", "policy_state_id_check", "CHECK ((id = 1))"),
    Check(
        "policy_state",
        "CHECK (max_active_turns >= 1)",
        "policy_state_max_active_turns_check",
        "CHECK ((max_active_turns >= 1))",
    ),
    Check(
        "policy_state",
        "CHECK (max_concurrent_starts >= 1)",
        "policy_state_max_concurrent_starts_check",
        "CHECK ((max_concurrent_starts >= 1))",
    ),
    Check(
        "policy_state",
        "CHECK (min_start_interval_ms >= 2000)",
        "policy_state_min_start_interval_ms_check",
        "CHECK ((min_start_interval_ms >= 2000))",
    ),
    Check(
        "policy_state",
        "CHECK (queue_timeout_ms > 0 AND queue_timeout_ms <= 1800000)",
        "policy_state_queue_timeout_ms_check",
        "CHECK (((queue_timeout_ms > 0) AND (queue_timeout_ms <= 1800000)))",
    ),
    Check(
        "policy_state",
        "CHECK (capacity_cooldown_ms >= 30000)",
        "policy_state_capacity_cooldown_ms_check",
        "CHECK ((capacity_cooldown_ms >= 30000))",
    ),
    Check(
        "policy_state",
        "CHECK (drain_state IN ('steady', 'soft_draining_to_1'))",
        "policy_state_drain_state_check",
        "CHECK ((drain_state = ANY (ARRAY['steady'::text, 'soft_draining_to_1'::text])))",
    ),
)

#: The seed's ``schema_migrations`` rows, exactly.
LEDGER: tuple[tuple[int, str], ...] = (
    (1, "shared-admission-queue"),
    (2, "shared-admission-queue-v2"),
    (3, "shared-admission-queue-v3"),
)
#: The Alembic revision of the seed's own v3 schema (what the original connector writes).
SEED_REVISION = "0003_seed_v3"


@dataclass(frozen=True)
class Extension:
    """One of our revisions after the seed's v3: columns appended to tables, new indexes, new tables."""

    revision: str
    columns: dict[str, tuple[Column, ...]]
    indexes: tuple[Index, ...] = ()
    tables: dict[str, tuple[Column, ...]] = field(default_factory=dict)


#: Our revisions after v3, in order. A database at one of them is no longer the seed's schema.
EXTENSIONS: tuple[Extension, ...] = (
    Extension(
        "0004_host_identity",
        {
            "lease_process_identities": _columns("host_id TEXT"),
            "queued_owner_instances": _columns("host_id TEXT"),
        },
    ),
    Extension(
        "0005_queue_deadline_index",
        {},
        (Index("turn_requests_state_deadline", "turn_requests", ("state", "deadline_at")),),
    ),
    Extension(
        "0006_policy_v2",
        {
            "turn_requests": _columns("lane TEXT NN DEFAULT 'default'"),
            "policy_state": _columns("revision INTEGER NN DEFAULT 0"),
        },
        (
            Index("turn_requests_session_state", "turn_requests", ("session_id", "state")),
            Index(
                "queue_entries_group",
                "queue_entries",
                ("lane", "provider", "model", "agent_id", "session_id", "enqueued_at", "request_id"),
            ),
            Index(
                "queue_sessions_order",
                "queue_sessions",
                ("lane", "provider", "model", "agent_id", "head_enqueued_at", "head_request_id"),
            ),
            Index(
                "queue_agents_order",
                "queue_agents",
                ("lane", "provider", "model", "head_enqueued_at", "head_request_id"),
            ),
            Index("queue_keys_order", "queue_keys", ("lane", "head_enqueued_at", "head_request_id")),
        ),
        {
            "policy_revisions": _columns("revision INTEGER PK NN", "created_at INTEGER NN", "document TEXT NN"),
            "admission_pauses": _columns(
                "lane TEXT NN PK1", "provider TEXT NN PK2", "model TEXT NN PK3", "since INTEGER NN"
            ),
            "lane_credits": _columns("lane TEXT PK NN", "credits INTEGER NN"),
            "queue_entries": _columns(
                "request_id TEXT PK NN",
                "lane TEXT NN",
                "provider TEXT NN",
                "model TEXT NN",
                "agent_id TEXT NN",
                "session_id TEXT NN",
                "enqueued_at INTEGER NN",
            ),
            "queue_sessions": _columns(
                "lane TEXT NN PK1",
                "provider TEXT NN PK2",
                "model TEXT NN PK3",
                "agent_id TEXT NN PK4",
                "session_id TEXT NN PK5",
                "head_enqueued_at INTEGER NN",
                "head_request_id TEXT NN",
            ),
            "queue_agents": _columns(
                "lane TEXT NN PK1",
                "provider TEXT NN PK2",
                "model TEXT NN PK3",
                "agent_id TEXT NN PK4",
                "head_enqueued_at INTEGER NN",
                "head_request_id TEXT NN",
            ),
            "queue_keys": _columns(
                "lane TEXT NN PK1",
                "provider TEXT NN PK2",
                "model TEXT NN PK3",
                "head_enqueued_at INTEGER NN",
                "head_request_id TEXT NN",
            ),
        },
    ),
    Extension(
        "0007_budgets",
        {},
        (
            Index("budget_charges_key", "budget_charges", ("provider", "model", "charged_at")),
            Index("budget_charges_provider", "budget_charges", ("provider", "charged_at")),
        ),
        {
            "budget_charges": _columns(
                "charge_id TEXT PK NN",
                "provider TEXT NN",
                "model TEXT NN",
                "charged_at INTEGER NN",
                "requests INTEGER NN",
                "reserved_tokens INTEGER NN",
                "used_tokens INTEGER",
                "state TEXT NN",
                "window_ms INTEGER",
            ),
            "turn_estimates": _columns("request_id TEXT PK NN", "tokens INTEGER NN"),
        },
    ),
)
#: The Alembic revision the service layer requires (``alembic_version`` must hold it).
EXPECTED_REVISION = EXTENSIONS[-1].revision
VERSION_TABLE = "alembic_version"


@dataclass(frozen=True)
class Spec:
    """The expected schema at one revision."""

    revision: str
    tables: dict[str, tuple[Column, ...]]
    indexes: tuple[Index, ...]


def expected_spec(revision: str = EXPECTED_REVISION) -> Spec:
    """The expected schema at ``revision`` (the seed's v3 or one of :data:`EXTENSIONS`)."""
    tables = dict(TABLES)
    indexes = INDEXES
    if revision == SEED_REVISION:
        return Spec(revision, tables, indexes)
    for extension in EXTENSIONS:
        for table, columns in extension.columns.items():
            tables[table] = tables[table] + columns
        tables.update(extension.tables)
        indexes = indexes + extension.indexes
        if extension.revision == revision:
            return Spec(revision, tables, indexes)
    raise SchemaIntegrityError(f"revision {revision} is not described by this schema check")


def foreign_tables(names: Iterable[str]) -> list[str]:
    """The tables (or views) among ``names`` that the admission plane does not own, sorted.

    It owns the admission tables, the seed's ``schema_migrations`` ledger and Alembic's
    ``alembic_version``; SQLite's own ``sqlite_%`` tables belong to nobody. A migration
    refuses a database holding any other table, and the schema check reports it, unless
    sharing the database was allowed (``allow_foreign_tables=True``).
    """
    owned = set(TABLES).union(*(extension.tables for extension in EXTENSIONS))
    return sorted(
        name for name in set(names) if name not in owned and name != VERSION_TABLE and not name.startswith("sqlite_")
    )


def expected_schema_version() -> int:
    """The original's schema version this code expects (its ``ADMISSION_SCHEMA_VERSION``, 3)."""
    return LEDGER[-1][0]
