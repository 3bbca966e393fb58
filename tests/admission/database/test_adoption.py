"""Adoption of databases written by the original connector, and the refusals that change nothing."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from seed_schema import (
    LEDGER,
    build_seed_database,
    connect,
    expected_rows_after_upgrade,
    ledger,
    master_sql,
    populate,
    snapshot,
    without_our_columns,
)

from admission_plane import migrate
from admission_plane.errors import AdmissionMigrationError
from admission_plane.store import schema_spec as schema_check


def alembic_version(path: Path) -> list[str] | None:
    """Rows of ``alembic_version``, or ``None`` when the table does not exist."""
    with closing(connect(path)) as connection:
        try:
            return [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
        except sqlite3.OperationalError:
            return None


def is_of_sessions(name: str) -> bool:
    """Whether a schema object is the seed's ``sessions`` table or one of its indexes (not 0006's
    ``queue_sessions``)."""
    return name == "sessions" or name.startswith("sessions_")


def state(path: Path) -> tuple[object, ...]:
    """Everything a refusal must leave untouched: schema text, ledger, version table, rows."""
    return master_sql(path), ledger(path), alembic_version(path), snapshot(path)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_seed_database_is_adopted_and_upgraded_with_every_row(tmp_path: Path, version: int) -> None:
    """Upgrading a seed database at ledger v1, v2 or v3 to Alembic head keeps every row of every table."""
    database = build_seed_database(tmp_path / f"seed-v{version}.sqlite", version)
    populate(database, version)
    command.upgrade(migrate.alembic_config(database), "head")
    assert without_our_columns(snapshot(database)) == expected_rows_after_upgrade(version)
    assert alembic_version(database) == [migrate.HEAD_REVISION]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_adoption_keeps_the_seed_ledger_rows_and_adds_the_missing_ones(tmp_path: Path, version: int) -> None:
    """The seed's own ledger rows keep their applied_at; the upgrade appends the versions it applied."""
    database = build_seed_database(tmp_path / "ledger.sqlite", version)
    original = ledger(database)
    migrate.upgrade(database)
    rows = ledger(database)
    assert rows[:version] == original
    assert [(number, name) for number, name, _ in rows] == sorted(LEDGER.items())


def test_adopted_v3_database_is_only_stamped(tmp_path: Path) -> None:
    """A seed database already at v3, upgraded to the seed's v3 revision, only gains Alembic's version row."""
    database = build_seed_database(tmp_path / "seed-v3.sqlite", 3)
    populate(database, 3)
    before = (master_sql(database), ledger(database), snapshot(database))
    migrate.upgrade(database, schema_check.SEED_REVISION)
    assert (master_sql(database), ledger(database), snapshot(database)) == before
    assert alembic_version(database) == [schema_check.SEED_REVISION]


def test_adopted_v1_database_has_the_seed_v3_schema_text(tmp_path: Path) -> None:
    """Upgrading a seed v1 database to the seed's v3 revision yields the same sqlite_master SQL as the seed's own
    v1-to-v3 chain."""
    adopted = build_seed_database(tmp_path / "adopted.sqlite", 1)
    migrate.upgrade(adopted, schema_check.SEED_REVISION)
    assert master_sql(adopted) == master_sql(build_seed_database(tmp_path / "seed.sqlite", 3))


def test_adopted_v1_database_renames_parent_id_and_keeps_sessions_unchanged(tmp_path: Path) -> None:
    """Upgrading a seed v1 database renames parent_id to agent_id, keeping its values, and leaves the SQL of the
    sessions table and its indexes unchanged."""
    database = build_seed_database(tmp_path / "v1.sqlite", 1)
    populate(database, 1)
    sessions_before = {key: sql for key, sql in master_sql(database).items() if is_of_sessions(key[1])}
    migrate.upgrade(database)
    with closing(connect(database)) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(turn_requests)")]
        foreign_keys = connection.execute("PRAGMA foreign_key_list(turn_requests)").fetchall()
    assert "agent_id" in columns
    assert "parent_id" not in columns
    assert foreign_keys == []
    assert {key: sql for key, sql in master_sql(database).items() if is_of_sessions(key[1])} == sessions_before


def test_strict_2_0_v2_database_comes_out_with_relaxed_checks_and_its_policy_row(tmp_path: Path) -> None:
    """A strict 2.0.x v2 database (seats IN (1, 3), one start) keeps its 3-seat policy row through the upgrade and
    afterwards accepts 8 seats and 8 starts."""
    database = build_seed_database(tmp_path / "strict.sqlite", 2, strict_v2=True)
    populate(database, 2)
    migrate.upgrade(database)
    adopted = without_our_columns(snapshot(database, ["policy_state"]))
    assert adopted["policy_state"] == expected_rows_after_upgrade(2)["policy_state"]
    with closing(connect(database)) as connection:
        connection.execute("UPDATE policy_state SET max_active_turns = 8, max_concurrent_starts = 8 WHERE id = 1")
        sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = 'policy_state'").fetchone()[0]
    assert "IN (1, 3)" not in sql
    assert "CHECK (max_active_turns >= 1)" in sql


def test_strict_2_0_v2_database_rejects_eight_seats_before_adoption(tmp_path: Path) -> None:
    """The strict 2.0.x v2 fixture really refuses 8 seats before the upgrade, so the relaxed checks after it come from
    the rebuild."""
    database = build_seed_database(tmp_path / "strict.sqlite", 2, strict_v2=True)
    populate(database, 2)
    with closing(connect(database)) as connection, pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        connection.execute("UPDATE policy_state SET max_active_turns = 8 WHERE id = 1")


def test_failed_adoption_step_leaves_the_seed_database_untouched(tmp_path: Path) -> None:
    """A seed v1 database holding a stray policy_state table is refused with the v2 step rolled back, left at v1 and
    without an Alembic stamp."""
    database = build_seed_database(tmp_path / "stray.sqlite", 1)
    populate(database, 1)
    with closing(connect(database)) as connection:
        connection.execute("CREATE TABLE policy_state (id INTEGER PRIMARY KEY)")
    before = state(database)
    with pytest.raises(AdmissionMigrationError, match=r"migration failed: v2 DDL transaction rolled back$"):
        migrate.upgrade(database)
    assert state(database) == before
    assert alembic_version(database) is None


def test_newer_ledger_is_refused_unchanged(tmp_path: Path) -> None:
    """A ledger at version 4 is refused as newer than this code supports, and nothing is written."""
    database = build_seed_database(tmp_path / "newer.sqlite", 3)
    with closing(connect(database)) as connection:
        connection.execute("INSERT INTO schema_migrations VALUES (4, 'shared-admission-queue-v4', 1)")
    before = state(database)
    with pytest.raises(AdmissionMigrationError, match="schema version 4 is newer than this connector supports"):
        migrate.upgrade(database)
    assert state(database) == before


def test_unversioned_admission_tables_are_refused_unchanged(tmp_path: Path) -> None:
    """Admission tables with neither schema_migrations nor alembic_version are refused, and nothing is written."""
    database = tmp_path / "unversioned.sqlite"
    with closing(connect(database)) as connection:
        connection.execute("CREATE TABLE turn_requests (request_id TEXT PRIMARY KEY)")
    before = master_sql(database)
    with pytest.raises(
        AdmissionMigrationError, match="unversioned admission tables require an explicit migration before use"
    ):
        migrate.upgrade(database)
    assert master_sql(database) == before
    assert alembic_version(database) is None


def test_misnamed_ledger_row_is_not_adopted(tmp_path: Path) -> None:
    """A ledger whose rows are not the seed's exactly is refused rather than guessed at."""
    database = build_seed_database(tmp_path / "misnamed.sqlite", 2)
    with closing(connect(database)) as connection:
        connection.execute("UPDATE schema_migrations SET name = 'other-queue' WHERE version = 2")
    before = state(database)
    with pytest.raises(AdmissionMigrationError, match="ledger does not match any known schema version"):
        migrate.upgrade(database)
    assert state(database) == before


def test_alembic_version_disagreeing_with_the_ledger_is_refused(tmp_path: Path) -> None:
    """An alembic_version at v3 over a ledger that stops at v2 is refused without change."""
    database = tmp_path / "disagree.sqlite"
    migrate.upgrade(database)
    with closing(connect(database)) as connection:
        connection.execute("DELETE FROM schema_migrations WHERE version = 3")
    before = state(database)
    expected = f"{migrate.HEAD_REVISION} disagrees with schema_migrations version 2"
    with pytest.raises(AdmissionMigrationError, match=expected):
        migrate.upgrade(database)
    assert state(database) == before


def test_unknown_alembic_revision_is_refused(tmp_path: Path) -> None:
    """An alembic_version naming a revision this code does not ship is refused as unknown."""
    database = tmp_path / "unknown.sqlite"
    migrate.upgrade(database)
    with closing(connect(database)) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0099_future'")
    with pytest.raises(AdmissionMigrationError, match="schema revision 0099_future is not known"):
        migrate.upgrade(database)


@pytest.mark.parametrize("version", ["3.24.0", "3.24", "2.8.17"])
def test_sqlite_older_than_3_25_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """An SQLite older than 3.25 (no ALTER TABLE RENAME COLUMN) is refused before anything is written."""
    monkeypatch.setattr(migrate, "read_sqlite_version", lambda _connection: version)
    database = build_seed_database(tmp_path / "old.sqlite", 1)
    before = state(database)
    with pytest.raises(AdmissionMigrationError, match=f"SQLite {version} does not support ALTER TABLE RENAME COLUMN"):
        migrate.upgrade(database)
    assert state(database) == before


@pytest.mark.parametrize("version", ["", "3", "3.x.1", "3.40.1.2", "-3.40", "３.40"])
def test_unparseable_sqlite_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """An SQLite version string that is not two or three decimal numbers is refused as unparseable."""
    monkeypatch.setattr(migrate, "read_sqlite_version", lambda _connection: version)
    with pytest.raises(AdmissionMigrationError, match=f"SQLite version {version} could not be parsed"):
        migrate.upgrade(tmp_path / "parse.sqlite")


def test_sqlite_3_25_is_accepted() -> None:
    """SQLite 3.25.0 itself is new enough, and a missing patch level reads as 0."""
    migrate.assert_rename_column_available("3.25.0")
    migrate.assert_rename_column_available("3.25")
