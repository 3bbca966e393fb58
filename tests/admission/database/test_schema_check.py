"""The fail-closed integrity check on SQLite files."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from seed_schema import build_seed_database, connect, populate
from sqlalchemy import Engine

from admission_plane import migrate
from admission_plane.errors import SchemaIntegrityError
from admission_plane.store import schema_spec as schema_check
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.schema_check import check_schema, expected_schema_version, schema_version


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """A file migrated to head by Alembic."""
    path = tmp_path / "admission.sqlite"
    migrate.upgrade(path)
    return path


@pytest.fixture
def engine(database: Path) -> Iterator[Engine]:
    """An admission engine on the migrated file."""
    engine = create_admission_engine(database)
    yield engine
    engine.dispose()


def tamper(path: Path, *statements: str) -> None:
    """Change the schema behind the check's back (foreign keys off so tables can be rebuilt)."""
    with closing(connect(path)) as connection:
        connection.execute("PRAGMA foreign_keys = OFF")
        for statement in statements:
            connection.execute(statement)


def refusal(engine: Engine, revision: str = schema_check.EXPECTED_REVISION) -> str:
    """The detail of the SchemaIntegrityError the check raises (against ``revision``, default head)."""
    with pytest.raises(SchemaIntegrityError) as raised:
        check_schema(engine, revision=revision)
    assert str(raised.value).startswith("admission schema integrity check failed: ")
    return raised.value.detail


def test_migrated_database_passes(engine: Engine) -> None:
    """A database migrated to head passes the integrity check."""
    check_schema(engine)


def test_seed_built_v3_database_passes_the_seed_revision_check(tmp_path: Path) -> None:
    """A v3 database written by the original connector, without alembic_version, passes the check against the seed v3
    revision."""
    path = build_seed_database(tmp_path / "seed.sqlite", 3)
    populate(path, 3)
    engine = create_admission_engine(path)
    try:
        check_schema(engine, revision=schema_check.SEED_REVISION)
    finally:
        engine.dispose()


def test_seed_built_v3_database_is_refused_until_upgraded_to_head(tmp_path: Path) -> None:
    """A seed database adopted but not yet upgraded to head is refused by the check for head with a clear message."""
    path = build_seed_database(tmp_path / "seed.sqlite", 3)
    engine = create_admission_engine(path)
    try:
        assert refusal(engine) == f"alembic_version does not hold revision {schema_check.EXPECTED_REVISION}"
    finally:
        engine.dispose()


def test_check_leaves_a_connection_outside_a_transaction(engine: Engine) -> None:
    """Checking through a connection neither opens a transaction it leaves behind nor changes anything."""
    with engine.connect() as connection:
        check_schema(connection)
        assert not connection.in_transaction()


def test_check_runs_inside_a_callers_transaction(engine: Engine) -> None:
    """A connection already in a transaction is checked in that transaction, which stays open."""
    with engine.connect() as connection, connection.begin():
        check_schema(connection)
        assert connection.in_transaction()


def test_foreign_keys_off_is_refused(engine: Engine) -> None:
    """A connection with foreign keys off is refused."""
    with engine.connect() as connection:
        # Outside a transaction: inside one SQLite ignores the pragma.
        connection.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")
        with pytest.raises(SchemaIntegrityError, match=re.escape("PRAGMA foreign_keys=ON is required")):
            check_schema(connection)
        connection.invalidate()


def test_newer_ledger_is_refused(database: Path, engine: Engine) -> None:
    """A ledger row newer than v3 is named as a newer schema version."""
    tamper(database, "INSERT INTO schema_migrations VALUES (4, 'shared-admission-queue-v4', 1)")
    assert refusal(engine) == "schema version 4 is newer than this connector supports"


def test_unversioned_admission_tables_are_refused(database: Path, engine: Engine) -> None:
    """Admission tables without the schema_migrations ledger are refused as unversioned."""
    tamper(database, "DROP TABLE schema_migrations")
    assert "unversioned admission tables" in refusal(engine)


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM schema_migrations WHERE version = 2",
        "UPDATE schema_migrations SET name = 'shared-admission-queue-2' WHERE version = 2",
        "UPDATE schema_migrations SET version = 0 WHERE version = 1",
    ],
    ids=["missing", "misnamed", "renumbered"],
)
def test_ledger_rows_not_exactly_the_seeds_are_refused(database: Path, engine: Engine, statement: str) -> None:
    """Ledger rows that are missing, misnamed or renumbered are refused."""
    tamper(database, statement)
    assert refusal(engine) == "schema_migrations ledger rows do not match the schema contract"


def test_extra_table_is_refused(database: Path, engine: Engine) -> None:
    """An unexpected table is refused and named."""
    tamper(database, "CREATE TABLE outbox (id INTEGER)")
    assert refusal(engine) == "unexpected table outbox is present"


def test_extra_trigger_is_refused(database: Path, engine: Engine) -> None:
    """A trigger, which could change rows behind the service's back, is named."""
    tamper(database, "CREATE TRIGGER sneaky AFTER INSERT ON events BEGIN SELECT 1; END")
    assert refusal(engine) == "unexpected trigger sneaky is present"


def test_dropped_column_is_refused(database: Path, engine: Engine) -> None:
    """A dropped column is refused naming its table."""
    tamper(database, "ALTER TABLE turn_requests DROP COLUMN queued_owner_recorded_at")
    assert refusal(engine) == "table turn_requests columns do not match the schema contract"


def test_changed_column_type_is_refused(database: Path, engine: Engine) -> None:
    """A column whose declared type changed (start_history.started_at INTEGER -> TEXT) is refused."""
    tamper(
        database,
        "DROP INDEX start_history_started",
        "ALTER TABLE start_history RENAME TO start_history_old",
        "CREATE TABLE start_history (lease_id TEXT PRIMARY KEY, started_at TEXT NOT NULL)",
        "CREATE INDEX start_history_started ON start_history(started_at)",
        "DROP TABLE start_history_old",
    )
    assert refusal(engine) == "table start_history columns do not match the schema contract"


def test_missing_index_is_refused(database: Path, engine: Engine) -> None:
    """A dropped named index is refused naming it."""
    tamper(database, "DROP INDEX leases_phase")
    assert refusal(engine) == "index leases_phase is missing"


def test_index_without_desc_is_refused(database: Path, engine: Engine) -> None:
    """An index whose DESC column became ascending is refused naming the index."""
    tamper(
        database,
        "DROP INDEX sessions_updated_at_session_id",
        "CREATE INDEX sessions_updated_at_session_id ON sessions(updated_at, session_id)",
    )
    assert refusal(engine) == "index sessions_updated_at_session_id does not match the schema contract"


def test_partial_index_made_total_is_refused(database: Path, engine: Engine) -> None:
    """The queued-owner index turned from partial into total is refused."""
    tamper(
        database,
        "DROP INDEX turn_requests_queued_owner",
        "CREATE INDEX turn_requests_queued_owner ON turn_requests(queued_owner_instance_id)",
    )
    assert refusal(engine) == "index turn_requests_queued_owner does not match the schema contract"


def test_strict_v2_policy_checks_are_refused(tmp_path: Path) -> None:
    """A policy_state table still carrying the strict 2.0.x CHECKs fails the v3 check even with a v3 ledger."""
    path = build_seed_database(tmp_path / "strict.sqlite", 2, strict_v2=True)
    tamper(path, "INSERT INTO schema_migrations VALUES (3, 'shared-admission-queue-v3', 1)")
    engine = create_admission_engine(path)
    try:
        detail = refusal(engine, schema_check.SEED_REVISION)
        assert detail == "table policy_state CHECK constraints do not match the schema contract"
    finally:
        engine.dispose()


def test_dropped_foreign_key_is_refused(database: Path, engine: Engine) -> None:
    """A turn_payloads table rebuilt without its ON DELETE CASCADE is refused."""
    tamper(
        database,
        "ALTER TABLE turn_payloads RENAME TO turn_payloads_old",
        "CREATE TABLE turn_payloads (request_id TEXT PRIMARY KEY REFERENCES turn_requests(request_id), "
        "nonce BLOB NOT NULL, ciphertext BLOB NOT NULL, auth_tag BLOB NOT NULL, key_version INTEGER NOT NULL, "
        "content_fingerprint TEXT NOT NULL, expires_at INTEGER NOT NULL, created_at INTEGER NOT NULL)",
        "DROP TABLE turn_payloads_old",
    )
    assert refusal(engine) == "table turn_payloads foreign keys do not match the schema contract"


def test_alembic_version_not_at_head_is_refused(database: Path, engine: Engine) -> None:
    """An alembic_version holding another revision than the expected one is refused."""
    tamper(database, "UPDATE alembic_version SET version_num = '0002_seed_v2'")
    assert refusal(engine) == f"alembic_version does not hold revision {schema_check.EXPECTED_REVISION}"


def test_schema_version_reads_the_ledger(engine: Engine, tmp_path: Path) -> None:
    """schema_version is the highest ledger version, or 0 without a ledger, and the expected version is 3."""
    assert schema_version(engine) == expected_schema_version() == 3
    empty = create_admission_engine(tmp_path / "empty.sqlite")
    try:
        assert schema_version(empty) == 0
    finally:
        empty.dispose()
