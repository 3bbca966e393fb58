"""Fail-closed integrity check of a live database against the expected v3 schema.

The expected schema is data (:data:`TABLES`, :data:`INDEXES`, :data:`FOREIGN_KEYS`,
:data:`UNIQUE_CONSTRAINTS`, :data:`CHECKS`, :data:`LEDGER`), compared with what the
database reports about itself: ``PRAGMA table_info``/``index_list``/``index_xinfo``/
``foreign_key_list`` and ``sqlite_master`` on SQLite, ``information_schema`` and
``pg_catalog`` on PostgreSQL. Anything that differs, missing or extra, raises
:class:`~admission_plane.errors.SchemaIntegrityError` naming it; nothing is repaired.
Besides the admission tables only Alembic's ``alembic_version`` (holding the head
revision) and SQLite's own ``sqlite_%`` tables may exist.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Engine

from .errors import SchemaIntegrityError
from .model import ADMISSION_TABLES

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
    "check_schema",
    "expected_schema_version",
    "expected_spec",
    "schema_version",
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


def _columns(*specs: str) -> tuple[Column, ...]:
    """``"name TYPE [PK|PKn] [NN] [DEFAULT v] [IDENTITY]"`` -> :class:`Column` (reads like the DDL)."""
    parsed = []
    for spec in specs:
        name, type_, *flags = spec.split()
        pk = next((int(flag[2:] or 1) for flag in flags if flag.startswith("PK")), 0)
        default = flags[flags.index("DEFAULT") + 1] if "DEFAULT" in flags else None
        parsed.append(Column(name, type_, "NN" in flags, pk, default, "IDENTITY" in flags))
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
        "request_id TEXT PK", "session_id TEXT NN", "agent_id TEXT NN", "fingerprint TEXT NN", "provider TEXT NN",
        "model TEXT NN", "state TEXT NN", "enqueued_at INTEGER NN", "deadline_at INTEGER NN",
        "lease_generation INTEGER NN DEFAULT 0", "terminal_at INTEGER", "queued_owner_instance_id TEXT",
        "queued_owner_recorded_at INTEGER",
    ),
    "leases": _columns(
        "lease_id TEXT PK", "request_id TEXT NN", "generation INTEGER NN", "owner_instance_id TEXT NN",
        "phase TEXT NN", "acquired_at INTEGER NN", "heartbeat_at INTEGER NN", "suspect_since INTEGER",
        "suspect_reason TEXT",
    ),
    "cooldowns": _columns(
        "provider TEXT NN PK1", "model TEXT NN PK2", "not_before INTEGER NN", "updated_at INTEGER NN"
    ),
    "turn_payloads": _columns(
        "request_id TEXT PK", "nonce BLOB NN", "ciphertext BLOB NN", "auth_tag BLOB NN", "key_version INTEGER NN",
        "content_fingerprint TEXT NN", "expires_at INTEGER NN", "created_at INTEGER NN",
    ),
    "lease_process_identities": _columns(
        "lease_id TEXT PK", "request_id TEXT NN", "lease_generation INTEGER NN", "owner_instance_id TEXT NN",
        "prompt_channel TEXT NN", "connector_owner_instance_id TEXT NN", "connector_created_at TEXT NN",
        "connector_boot_id TEXT NN", "connector_pid INTEGER NN", "connector_start_time_ticks TEXT NN",
        "connector_pid_namespace_inode INTEGER NN", "connector_ppid INTEGER NN", "connector_pgrp INTEGER NN",
        "connector_session INTEGER NN", "child_boot_id TEXT NN", "child_pid INTEGER NN",
        "child_start_time_ticks TEXT NN", "child_pid_namespace_inode INTEGER NN", "child_ppid INTEGER NN",
        "child_pgrp INTEGER NN", "child_session INTEGER NN", "recorded_at INTEGER NN",
    ),
    "start_history": _columns("lease_id TEXT PK", "started_at INTEGER NN"),
    "sessions": _columns(
        "session_id TEXT NN PK", "conversation_id TEXT", "conversation_cursor INTEGER NN", "model TEXT NN",
        "effort TEXT NN", "mode TEXT NN", "cwd TEXT NN", "roots_json TEXT NN", "v2_user_message_ids_json TEXT NN",
        "updated_at INTEGER NN",
    ),
    "events": _columns(
        "event_seq INTEGER PK IDENTITY", "kind TEXT NN", "from_state TEXT NN", "to_state TEXT NN",
        "occurred_at INTEGER NN", "correlation_hmac TEXT NN",
    ),
    "policy_state": _columns(
        "id INTEGER PK", "max_active_turns INTEGER NN", "max_concurrent_starts INTEGER NN",
        "min_start_interval_ms INTEGER NN", "queue_timeout_ms INTEGER NN", "capacity_cooldown_ms INTEGER NN",
        "drain_state TEXT NN", "policy_fingerprint TEXT NN", "updated_at INTEGER NN",
        "updated_by_owner_instance_id TEXT NN",
    ),
    "queued_owner_instances": _columns(
        "owner_instance_id TEXT PK", "created_at TEXT NN", "boot_id TEXT NN", "pid INTEGER NN",
        "start_time_ticks TEXT NN", "pid_namespace_inode INTEGER NN", "ppid INTEGER NN", "pgrp INTEGER NN",
        "session INTEGER NN", "recorded_at INTEGER NN",
    ),
}

INDEXES: tuple[Index, ...] = (
    Index("turn_requests_queue", "turn_requests", ("state", "enqueued_at")),
    Index("turn_requests_queued_owner", "turn_requests", ("queued_owner_instance_id",),
          where="queued_owner_instance_id IS NOT NULL"),
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
    Check("leases", "suspect_reason TEXT CHECK (suspect_reason IS NULL OR suspect_reason IN "
          "('heartbeat_expired', 'identity_unverifiable'))", "leases_suspect_reason_check",
          "CHECK (((suspect_reason IS NULL) OR (suspect_reason = ANY "
          "(ARRAY['heartbeat_expired'::text, 'identity_unverifiable'::text]))))"),
    Check("events", "event_seq INTEGER PRIMARY KEY AUTOINCREMENT"),
    Check("policy_state", "id INTEGER PRIMARY KEY CHECK (id = 1)", "policy_state_id_check", "CHECK ((id = 1))"),
    Check("policy_state", "CHECK (max_active_turns >= 1)", "policy_state_max_active_turns_check",
          "CHECK ((max_active_turns >= 1))"),
    Check("policy_state", "CHECK (max_concurrent_starts >= 1)", "policy_state_max_concurrent_starts_check",
          "CHECK ((max_concurrent_starts >= 1))"),
    Check("policy_state", "CHECK (min_start_interval_ms >= 2000)", "policy_state_min_start_interval_ms_check",
          "CHECK ((min_start_interval_ms >= 2000))"),
    Check("policy_state", "CHECK (queue_timeout_ms > 0 AND queue_timeout_ms <= 1800000)",
          "policy_state_queue_timeout_ms_check", "CHECK (((queue_timeout_ms > 0) AND (queue_timeout_ms <= 1800000)))"),
    Check("policy_state", "CHECK (capacity_cooldown_ms >= 30000)", "policy_state_capacity_cooldown_ms_check",
          "CHECK ((capacity_cooldown_ms >= 30000))"),
    Check("policy_state", "CHECK (drain_state IN ('steady', 'soft_draining_to_1'))", "policy_state_drain_state_check",
          "CHECK ((drain_state = ANY (ARRAY['steady'::text, 'soft_draining_to_1'::text])))"),
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
    """One of our revisions after the seed's v3: columns appended to tables, and new indexes."""

    revision: str
    columns: dict[str, tuple[Column, ...]]
    indexes: tuple[Index, ...] = ()


#: Our revisions after v3, in order. A database at one of them is no longer the seed's schema.
EXTENSIONS: tuple[Extension, ...] = (
    Extension("0004_host_identity", {
        "lease_process_identities": _columns("host_id TEXT"),
        "queued_owner_instances": _columns("host_id TEXT"),
    }),
    Extension("0005_queue_deadline_index", {}, (
        Index("turn_requests_state_deadline", "turn_requests", ("state", "deadline_at")),
    )),
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
        indexes = indexes + extension.indexes
        if extension.revision == revision:
            return Spec(revision, tables, indexes)
    raise SchemaIntegrityError(f"revision {revision} is not described by this schema check")

Query = Callable[..., list[tuple[Any, ...]]]


def expected_schema_version() -> int:
    """The seed schema version this code expects (``ADMISSION_SCHEMA_VERSION`` = 3)."""
    return LEDGER[-1][0]


def schema_version(target: Engine | Connection) -> int:
    """The database's ledger version: 0 without a ``schema_migrations`` table, else ``MAX(version)``."""
    with _reader(target) as (query, dialect):
        if "schema_migrations" not in _table_names(query, dialect):
            return 0
        return int(query("SELECT MAX(version) FROM schema_migrations")[0][0] or 0)


def check_schema(target: Engine | Connection, *, revision: str = EXPECTED_REVISION) -> None:
    """Raise :class:`SchemaIntegrityError` unless the database is exactly the schema of ``revision``.

    The default is the head revision the service layer needs. With
    ``revision=SEED_REVISION`` a database written by the original connector (no
    ``alembic_version`` table) passes too. Reads only; a connection passed in keeps its
    transaction state (a transaction this function had to open is rolled back).
    """
    spec = expected_spec(revision)
    with _reader(target) as (query, dialect):
        if dialect == "sqlite":
            _check_sqlite(query, spec)
        elif dialect == "postgresql":
            _check_postgresql(query, spec)
        else:
            raise SchemaIntegrityError(f"database dialect {dialect} is not supported")


@contextmanager
def _reader(target: Engine | Connection) -> Iterator[tuple[Query, str]]:
    if isinstance(target, Engine):
        with target.connect() as connection, _reader(connection) as reader:
            yield reader
        return
    dialect = target.dialect.name
    if dialect == "sqlite" and not target.in_transaction():
        # A deferred BEGIN on the driver connection: one consistent snapshot, no write lock.
        raw: Any = target.connection.driver_connection
        raw.execute("BEGIN")
        try:
            yield (lambda sql, *params: raw.execute(sql, params).fetchall()), dialect
        finally:
            raw.execute("ROLLBACK")
        return
    began = not target.in_transaction()
    try:
        yield (lambda sql, *params: [tuple(row) for row in target.exec_driver_sql(sql, tuple(params))]), dialect
    finally:
        if began and target.in_transaction():
            target.rollback()


def _table_names(query: Query, dialect: str) -> set[str]:
    if dialect == "sqlite":
        return {name for (name,) in query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {name for (name,) in query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}


def _compare_names(kind: str, actual: set[str], expected: set[str]) -> None:
    for name in sorted(actual - expected):
        raise SchemaIntegrityError(f"unexpected {kind} {name} is present")
    for name in sorted(expected - actual):
        raise SchemaIntegrityError(f"{kind} {name} is missing")


ColumnsOf = Callable[[str], tuple[tuple[Any, ...], ...]]


def _check_ledger_and_tables(
    query: Query, spec: Spec, tables: set[str], actual: ColumnsOf, expected: ColumnsOf
) -> None:
    """The checks both dialects share: ledger, table set, Alembic's version, and every table's columns."""
    if "schema_migrations" not in tables:
        if tables.intersection(ADMISSION_TABLES):
            raise SchemaIntegrityError("unversioned admission tables are present (no schema_migrations ledger)")
        raise SchemaIntegrityError("the schema_migrations ledger is missing")
    if actual("schema_migrations") != expected("schema_migrations"):
        raise SchemaIntegrityError("table schema_migrations columns do not match the schema contract")
    rows = [(int(version), name) for version, name in query("SELECT version, name FROM schema_migrations")]
    newest = max((version for version, _ in rows), default=0)
    if newest > expected_schema_version():
        raise SchemaIntegrityError(f"schema version {newest} is newer than this connector supports")
    if sorted(rows) != list(LEDGER):
        raise SchemaIntegrityError("schema_migrations ledger rows do not match the schema contract")
    present = {name for name in tables if not name.startswith("sqlite_") and name != VERSION_TABLE}
    _compare_names("table", present, set(spec.tables))
    seed_written = spec.revision == SEED_REVISION and VERSION_TABLE not in tables
    if not seed_written and (
        VERSION_TABLE not in tables or query(f"SELECT version_num FROM {VERSION_TABLE}") != [(spec.revision,)]
    ):
        raise SchemaIntegrityError(f"{VERSION_TABLE} does not hold revision {spec.revision}")
    for table in spec.tables:
        if actual(table) != expected(table):
            raise SchemaIntegrityError(f"table {table} columns do not match the schema contract")


def _index_columns(index: Index) -> tuple[tuple[str, bool], ...]:
    return tuple((part.split()[0], part.endswith(" DESC")) for part in index.columns)


def _normalized(sql: str) -> str:
    return " ".join(sql.split())


# --- SQLite -----------------------------------------------------------------------------


def _check_sqlite(query: Query, spec: Spec) -> None:
    if query("PRAGMA foreign_keys") != [(1,)]:
        raise SchemaIntegrityError("PRAGMA foreign_keys=ON is required")
    master = query("SELECT type, name, tbl_name, sql FROM sqlite_master")
    for kind in ("view", "trigger"):
        _compare_names(kind, {name for type_, name, _, _ in master if type_ == kind}, set())

    def actual(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple((name, type_, bool(notnull), pk, default)
                     for _, name, type_, notnull, default, pk in query(f'PRAGMA table_info("{table}")'))

    def expected(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple((c.name, c.type, c.notnull, c.pk, c.default) for c in spec.tables[table])

    table_names = {name for type_, name, _, _ in master if type_ == "table"}
    _check_ledger_and_tables(query, spec, table_names, actual, expected)
    table_sql = {name: _normalized(sql or "") for type_, name, _, sql in master if type_ == "table"}
    for table in spec.tables:
        fragments = [check.sqlite_fragment for check in CHECKS if check.table == table]
        expected_checks = sum(fragment.count("CHECK") for fragment in fragments)
        if any(_normalized(fragment) not in table_sql[table] for fragment in fragments) or len(
            re.findall(r"\bCHECK\b", table_sql[table], re.IGNORECASE)
        ) != expected_checks:
            raise SchemaIntegrityError(f"table {table} CHECK constraints do not match the schema contract")
        foreign_keys = {
            (row[2], row[3], row[4], row[5], row[6]) for row in query(f'PRAGMA foreign_key_list("{table}")')
        }
        expected_keys = {(fk.target, fk.columns[0], fk.target_columns[0], "NO ACTION", fk.on_delete)
                         for fk in FOREIGN_KEYS if fk.table == table}
        if foreign_keys != expected_keys:
            raise SchemaIntegrityError(f"table {table} foreign keys do not match the schema contract")

    named = {name: (table, sql) for type_, name, table, sql in master if type_ == "index" and sql is not None}
    _compare_names("index", set(named), {index.name for index in spec.indexes})
    for index in spec.indexes:
        listed = {row[1]: row for row in query(f'PRAGMA index_list("{index.table}")')}
        row = listed.get(index.name)
        keys = tuple((name, bool(desc), collation) for _, _, name, desc, collation, key
                     in query(f'PRAGMA index_xinfo("{index.name}")') if key)
        expected_keys_ = tuple((name, desc, "BINARY") for name, desc in _index_columns(index))
        where_ok = index.where is None or f"WHERE {index.where}" in _normalized(named[index.name][1])
        if (row is None or bool(row[2]) != index.unique or bool(row[4]) != (index.where is not None)
                or keys != expected_keys_ or not where_ok):
            raise SchemaIntegrityError(f"index {index.name} does not match the schema contract")

    unique = set()
    for table in spec.tables:
        for _, name, _unique, origin, _ in query(f'PRAGMA index_list("{table}")'):
            if origin == "u":
                keys = tuple(row[2] for row in query(f'PRAGMA index_info("{name}")'))
                unique.add((table, keys))
    if unique != set(UNIQUE_CONSTRAINTS):
        raise SchemaIntegrityError("unique constraints do not match the schema contract")


# --- PostgreSQL -------------------------------------------------------------------------

_PG_TYPES = {"INTEGER": "bigint", "TEXT": "text", "BLOB": "bytea"}


def _check_postgresql(query: Query, spec: Spec) -> None:
    def actual(table: str) -> tuple[tuple[Any, ...], ...]:
        keys = query(
            "SELECT a.attname FROM pg_constraint c JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n) "
            "ON TRUE JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
            "WHERE c.contype = 'p' AND c.conrelid = to_regclass(quote_ident(%s)) ORDER BY k.n", table)
        positions = {name: position for position, (name,) in enumerate(keys, start=1)}
        rows = query(
            "SELECT column_name, data_type, is_nullable, column_default, is_identity FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position", table)
        return tuple((name, type_, nullable == "NO", positions.get(name, 0), default, identity == "YES")
                     for name, type_, nullable, default, identity in rows)

    def expected(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple((c.name, _PG_TYPES[c.type], c.notnull or c.pk > 0, c.pk, c.default, c.identity)
                     for c in spec.tables[table])

    _check_ledger_and_tables(query, spec, _table_names(query, "postgresql"), actual, expected)

    constraints = query(
        "SELECT c.conrelid::regclass::text, c.contype, c.conname, pg_get_constraintdef(c.oid), c.confdeltype, "
        "c.confrelid::regclass::text, "
        "ARRAY(SELECT attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i) JOIN pg_attribute a "
        "      ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i), "
        "ARRAY(SELECT attname FROM unnest(c.confkey) WITH ORDINALITY k(n, i) JOIN pg_attribute a "
        "      ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i) "
        "FROM pg_constraint c WHERE c.connamespace = current_schema()::regnamespace AND c.contype IN ('c', 'f', 'u')")
    checks = {(table, name, definition) for table, kind, name, definition, *_ in constraints if kind == "c"}
    if checks != {(c.table, c.pg_name, c.pg_definition) for c in CHECKS if c.pg_name is not None}:
        raise SchemaIntegrityError("CHECK constraints do not match the schema contract")
    actions = {"a": "NO ACTION", "c": "CASCADE", "r": "RESTRICT", "n": "SET NULL", "d": "SET DEFAULT"}
    foreign_keys = {(table, tuple(columns), target, tuple(target_columns), actions.get(delete, delete))
                    for table, kind, _, _, delete, target, columns, target_columns in constraints if kind == "f"}
    if foreign_keys != {(fk.table, fk.columns, fk.target, fk.target_columns, fk.on_delete) for fk in FOREIGN_KEYS}:
        raise SchemaIntegrityError("foreign keys do not match the schema contract")
    unique = {(table, tuple(columns)) for table, kind, _, _, _, _, columns, _ in constraints if kind == "u"}
    if unique != set(UNIQUE_CONSTRAINTS):
        raise SchemaIntegrityError("unique constraints do not match the schema contract")
    if query("SELECT tgname FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid "
             "WHERE NOT t.tgisinternal AND r.relnamespace = current_schema()::regnamespace"):
        raise SchemaIntegrityError("unexpected trigger is present")

    indexes = query(
        "SELECT r.relname, t.relname, i.indisunique, pg_get_expr(i.indpred, i.indrelid), "
        "ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true) FROM generate_series(1, i.indnkeyatts) k ORDER BY k), "
        "ARRAY(SELECT (i.indoption[k - 1] & 1) = 1 FROM generate_series(1, i.indnkeyatts) k ORDER BY k) "
        "FROM pg_index i JOIN pg_class r ON r.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname <> %s "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)", VERSION_TABLE)
    actual = {name: (table, unique_, where, tuple(zip(columns, descending, strict=True)))
              for name, table, unique_, where, columns, descending in indexes}
    _compare_names("index", set(actual), {index.name for index in spec.indexes})
    for index in spec.indexes:
        where = index.pg_where or (None if index.where is None else f"({index.where})")
        expected = (index.table, index.unique, where, _index_columns(index))
        if actual[index.name] != expected:
            raise SchemaIntegrityError(f"index {index.name} does not match the schema contract")

