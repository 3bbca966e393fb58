"""The same Alembic history and integrity check on PostgreSQL, which the original connector never used."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import Engine

from admission_plane import migrate
from admission_plane.errors import AdmissionMigrationError, SchemaIntegrityError
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.schema_check import check_schema, schema_version

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    """An admission engine on a fresh PostgreSQL database."""
    engine = create_admission_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def migrated(engine: Engine) -> Engine:
    """The fresh database upgraded to head."""
    migrate.upgrade(engine)
    return engine


def execute(engine: Engine, *statements: str) -> None:
    """Run statements in one committed transaction."""
    with engine.begin() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)


def tables(engine: Engine) -> set[str]:
    """Tables of the current schema."""
    return set(sa.inspect(engine).get_table_names())


def test_upgrade_head_builds_the_schema_and_ledger(migrated: Engine) -> None:
    """Upgrading to head creates the v3 tables, ledger rows 1 to 3 and the head revision."""
    with migrated.connect() as connection:
        rows = connection.exec_driver_sql("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert [tuple(row) for row in rows] == list(migrate.SEED_LEDGER)
    assert migrate.current_revision(migrated) == migrate.HEAD_REVISION
    assert schema_version(migrated) == 3


def test_migrated_database_passes_the_integrity_check(migrated: Engine) -> None:
    """The catalog of a migrated database matches the expected schema."""
    check_schema(migrated)


def test_alembic_check_finds_no_drift_on_postgresql(migrated: Engine, postgres_url: str) -> None:
    """`alembic check` reports no difference between admission_plane.model and the migrated database."""
    command.check(migrate.alembic_config(postgres_url))


def test_round_trip_keeps_rows_and_the_renamed_column(migrated: Engine) -> None:
    """An upgrade to head, a downgrade to v1 and an upgrade to head again keep a request row, its agent id (parent_id at
    v1) and a BIGINT timestamp."""
    execute(
        migrated,
        "INSERT INTO turn_requests (request_id, session_id, agent_id, fingerprint, provider, model, state, "
        "enqueued_at, deadline_at) VALUES ('r1', 's1', 'agent-a', 'f', 'p', 'm', 'queued', 1700000000000, "
        "1700001800000)",
    )
    migrate.downgrade(migrated, "0001_seed_v1")
    with migrated.connect() as connection:
        assert connection.exec_driver_sql("SELECT parent_id FROM turn_requests").scalar_one() == "agent-a"
    migrate.upgrade(migrated)
    with migrated.connect() as connection:
        row = connection.exec_driver_sql("SELECT agent_id, enqueued_at FROM turn_requests").one()
    assert tuple(row) == ("agent-a", 1_700_000_000_000)
    check_schema(migrated)


def test_downgrade_base_removes_every_admission_table(migrated: Engine) -> None:
    """Downgrading to base leaves only Alembic's empty version table."""
    migrate.downgrade(migrated, "base")
    assert tables(migrated) == {"alembic_version"}
    assert migrate.current_revision(migrated) is None


def test_failed_step_rolls_back_on_postgresql(engine: Engine) -> None:
    """A stray policy_state table makes the v2 step fail and leaves the database at v1."""
    migrate.upgrade(engine, "0001_seed_v1")
    execute(engine, "CREATE TABLE policy_state (id BIGINT PRIMARY KEY)")
    with pytest.raises(AdmissionMigrationError, match="v2 DDL transaction rolled back"):
        migrate.upgrade(engine)
    assert migrate.current_revision(engine) == "0001_seed_v1"
    assert "parent_id" in {column["name"] for column in sa.inspect(engine).get_columns("turn_requests")}


def test_changed_column_type_is_refused(migrated: Engine) -> None:
    """A column whose type drifted (events.occurred_at BIGINT -> INTEGER) is refused naming its table."""
    execute(migrated, "ALTER TABLE events ALTER COLUMN occurred_at TYPE INTEGER")
    with pytest.raises(SchemaIntegrityError, match="table events columns do not match the schema contract"):
        check_schema(migrated)


def test_dropped_check_constraint_is_refused(migrated: Engine) -> None:
    """A dropped CHECK constraint of policy_state is refused."""
    execute(migrated, "ALTER TABLE policy_state DROP CONSTRAINT policy_state_max_active_turns_check")
    with pytest.raises(SchemaIntegrityError, match="CHECK constraints do not match the schema contract"):
        check_schema(migrated)


def test_missing_index_is_refused(migrated: Engine) -> None:
    """A dropped named index is refused naming it."""
    execute(migrated, "DROP INDEX events_occurred")
    with pytest.raises(SchemaIntegrityError, match="index events_occurred is missing"):
        check_schema(migrated)


def test_ascending_index_is_refused(migrated: Engine) -> None:
    """An index whose DESC column became ascending is refused naming the index."""
    execute(
        migrated,
        "DROP INDEX sessions_updated_at_session_id",
        "CREATE INDEX sessions_updated_at_session_id ON sessions (updated_at, session_id)",
    )
    with pytest.raises(SchemaIntegrityError, match="index sessions_updated_at_session_id does not match"):
        check_schema(migrated)


def test_extra_table_is_refused(migrated: Engine) -> None:
    """An unexpected table is named."""
    execute(migrated, "CREATE TABLE outbox (id BIGINT)")
    with pytest.raises(SchemaIntegrityError, match="unexpected table outbox is present"):
        check_schema(migrated)


def test_cascade_removed_is_refused(migrated: Engine) -> None:
    """A foreign key that lost ON DELETE CASCADE is refused."""
    execute(
        migrated,
        "ALTER TABLE turn_payloads DROP CONSTRAINT turn_payloads_request_id_fkey",
        "ALTER TABLE turn_payloads ADD CONSTRAINT turn_payloads_request_id_fkey FOREIGN KEY (request_id) "
        "REFERENCES turn_requests(request_id)",
    )
    with pytest.raises(SchemaIntegrityError, match="foreign keys do not match the schema contract"):
        check_schema(migrated)


def test_newer_ledger_is_refused_by_upgrade_and_check(migrated: Engine) -> None:
    """A ledger row 4 is refused by the upgrade and named by the integrity check."""
    execute(migrated, "INSERT INTO schema_migrations VALUES (4, 'shared-admission-queue-v4', 1)")
    with pytest.raises(AdmissionMigrationError, match="schema version 4 is newer than this connector supports"):
        migrate.upgrade(migrated)
    with pytest.raises(SchemaIntegrityError, match="schema version 4 is newer"):
        check_schema(migrated)


def test_unversioned_admission_tables_are_refused(engine: Engine) -> None:
    """Admission tables without any version record are refused by the upgrade and left alone."""
    execute(engine, "CREATE TABLE sessions (session_id TEXT PRIMARY KEY)")
    with pytest.raises(AdmissionMigrationError, match="unversioned admission tables require an explicit migration"):
        migrate.upgrade(engine)
    assert tables(engine) == {"sessions"}


def test_ledger_without_alembic_version_is_not_adopted_on_postgresql(engine: Engine) -> None:
    """A PostgreSQL database with a ledger but no alembic_version is refused, because only SQLite databases of the
    original connector are adopted."""
    execute(
        engine,
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        "INSERT INTO schema_migrations VALUES (1, 'shared-admission-queue', 1)",
    )
    with pytest.raises(AdmissionMigrationError, match="only SQLite databases of the original connector"):
        migrate.upgrade(engine)
    assert tables(engine) == {"schema_migrations"}
