"""The Alembic history on SQLite files: upgrade, downgrade, round trips, all-or-nothing steps."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from seed_schema import (
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

REPO_ROOT = Path(__file__).resolve().parents[3]
V3_TABLES = {
    "schema_migrations",
    "turn_requests",
    "leases",
    "cooldowns",
    "turn_payloads",
    "lease_process_identities",
    "start_history",
    "sessions",
    "events",
    "policy_state",
    "queued_owner_instances",
}
#: Revision 0006 (policy v2): revisions, pauses, lane credits and the admission index.
POLICY_V2_TABLES = {
    "policy_revisions",
    "admission_pauses",
    "lane_credits",
    "queue_entries",
    "queue_sessions",
    "queue_agents",
    "queue_keys",
}
#: Revision 0007 (budgets): charges and token estimates.
BUDGET_TABLES = {"budget_charges", "turn_estimates"}


def tables(path: Path) -> set[str]:
    """Names of the tables in ``path`` outside ``sqlite_%``."""
    with closing(connect(path)) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        return {name for (name,) in rows}


def alembic_version(path: Path) -> list[str]:
    """The rows of ``alembic_version`` (empty when the table is absent)."""
    with closing(connect(path)) as connection:
        try:
            return [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
        except sqlite3.OperationalError:
            return []


def columns(path: Path, table: str) -> list[str]:
    """Column names of ``table`` in order."""
    with closing(connect(path)) as connection:
        return [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]


def run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    """Run ``alembic`` from the repository root, as an operator does."""
    return subprocess.run(
        [sys.executable, "-m", "alembic", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def test_upgrade_head_creates_the_eleven_v3_tables_the_policy_v2_tables_and_the_ledger(tmp_path: Path) -> None:
    """A new file upgraded to head holds exactly the v3 tables, revision 0006's seven tables, revision 0007's two,
    ledger rows 1 to 3 and Alembic's version row."""
    database = tmp_path / "fresh.sqlite"
    command.upgrade(migrate.alembic_config(database), "head")
    assert tables(database) == V3_TABLES | POLICY_V2_TABLES | BUDGET_TABLES | {"alembic_version"}
    assert [(version, name) for version, name, _ in ledger(database)] == list(migrate.SEED_LEDGER)
    assert alembic_version(database) == [migrate.HEAD_REVISION]


def test_ledger_applied_at_is_wall_clock_milliseconds(tmp_path: Path) -> None:
    """Each ledger row's applied_at is the wall clock in integer milliseconds when its step ran."""
    import time

    before = time.time_ns() // 1_000_000
    database = tmp_path / "clock.sqlite"
    migrate.upgrade(database)
    after = time.time_ns() // 1_000_000
    assert all(isinstance(applied_at, int) and before <= applied_at <= after for _, _, applied_at in ledger(database))


def test_downgrade_base_removes_every_admission_table(tmp_path: Path) -> None:
    """Downgrading to base drops every admission table and the ledger, leaving Alembic's empty version table."""
    database = tmp_path / "base.sqlite"
    migrate.upgrade(database)
    migrate.downgrade(database, "base")
    assert tables(database) == {"alembic_version"}
    assert alembic_version(database) == []


def test_each_downgrade_step_deletes_its_ledger_row(tmp_path: Path) -> None:
    """Downgrading one step at a time removes ledger rows 3 then 2 and restores parent_id."""
    database = tmp_path / "steps.sqlite"
    migrate.upgrade(database)
    migrate.downgrade(database, "0002_seed_v2")
    assert [version for version, _, _ in ledger(database)] == [1, 2]
    migrate.downgrade(database, "0001_seed_v1")
    assert [version for version, _, _ in ledger(database)] == [1]
    assert "parent_id" in columns(database, "turn_requests")
    assert "policy_state" not in tables(database)


def test_populated_database_survives_upgrade_downgrade_upgrade(tmp_path: Path) -> None:
    """Rows of every table, including the renamed column's values, survive an upgrade to head, a downgrade to v1 and an
    upgrade to head again."""
    database = tmp_path / "populated.sqlite"
    command.upgrade(migrate.alembic_config(database), "0001_seed_v1")
    populate(database, 1)
    command.upgrade(migrate.alembic_config(database), "head")
    migrate.downgrade(database, "0001_seed_v1")
    with closing(connect(database)) as connection:
        agents = sorted(row[0] for row in connection.execute("SELECT parent_id FROM turn_requests"))
    assert agents == ["agent-a", "agent-b", "agent-é"]
    migrate.upgrade(database)
    assert without_our_columns(snapshot(database)) == expected_rows_after_upgrade(1)


def test_policy_row_survives_a_v3_downgrade_and_upgrade(tmp_path: Path) -> None:
    """The durable policy row is copied through the v3 rebuild in both directions."""
    database = tmp_path / "policy.sqlite"
    command.upgrade(migrate.alembic_config(database), "0002_seed_v2")
    populate(database, 2)
    migrate.upgrade(database)
    migrate.downgrade(database, "0002_seed_v2")
    migrate.upgrade(database)
    assert without_our_columns(snapshot(database, ["policy_state"])) == {
        "policy_state": expected_rows_after_upgrade(2)["policy_state"]
    }


def test_v3_downgrade_restores_the_seed_v2_table_text(tmp_path: Path) -> None:
    """After a v3 downgrade, policy_state's SQL is the original connector's v2 text byte for byte."""
    seed = build_seed_database(tmp_path / "seed-v2.sqlite", 2)
    database = tmp_path / "down.sqlite"
    migrate.upgrade(database)
    migrate.downgrade(database, "0002_seed_v2")
    assert master_sql(database)[("table", "policy_state")] == master_sql(seed)[("table", "policy_state")]


def test_upgrade_of_an_up_to_date_database_changes_nothing(tmp_path: Path) -> None:
    """Upgrading a database already at head runs no step and keeps schema, ledger and version."""
    database = tmp_path / "stable.sqlite"
    migrate.upgrade(database)
    before = (master_sql(database), ledger(database), alembic_version(database))
    migrate.upgrade(database)
    assert (master_sql(database), ledger(database), alembic_version(database)) == before


def test_failed_step_rolls_back_everything_it_did(tmp_path: Path) -> None:
    """A v2 step that fails after renaming and adding columns leaves the database exactly at v1."""
    database = tmp_path / "stray.sqlite"
    migrate.upgrade(database, "0001_seed_v1")
    with closing(connect(database)) as connection:
        connection.execute("CREATE TABLE policy_state (id INTEGER PRIMARY KEY)")
    before = (master_sql(database), ledger(database))
    with pytest.raises(AdmissionMigrationError, match=r"failed: v2 DDL transaction rolled back$"):
        migrate.upgrade(database)
    assert (master_sql(database), ledger(database)) == before
    assert alembic_version(database) == ["0001_seed_v1"]
    assert "parent_id" in columns(database, "turn_requests")


def test_failed_first_step_leaves_no_version_table(tmp_path: Path) -> None:
    """A v1 step failing at its last index rolls back its tables and Alembic's version table with it."""
    database = tmp_path / "first.sqlite"
    with closing(connect(database)) as connection:
        connection.execute("CREATE TABLE cooldowns_shadow (x)")
        connection.execute("CREATE INDEX leases_phase ON cooldowns_shadow(x)")
    with pytest.raises(AdmissionMigrationError, match="v2 DDL transaction rolled back"):
        migrate.upgrade(database, allow_foreign_tables=True)  # cooldowns_shadow is not the plane's own
    assert tables(database) == {"cooldowns_shadow"}


def test_upgrade_resolves_the_database_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a URL argument, the migration environment reads ADMISSION_PLANE_DATABASE_URL, where a plain path names an
    SQLite file."""
    database = tmp_path / "env.sqlite"
    monkeypatch.setenv(migrate.URL_ENVIRONMENT_VARIABLE, str(database))
    command.upgrade(migrate.alembic_config(), "head")
    assert alembic_version(database) == [migrate.HEAD_REVISION]


def test_upgrade_without_any_database_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no URL, no environment variable and no sqlalchemy.url, the upgrade is refused naming the missing setting."""
    monkeypatch.delenv(migrate.URL_ENVIRONMENT_VARIABLE, raising=False)
    with pytest.raises(AdmissionMigrationError, match="no database given"):
        command.upgrade(migrate.alembic_config(), "head")


def test_alembic_config_works_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged configuration finds the migrations directory whatever the current directory is."""
    monkeypatch.chdir(tmp_path)
    migrate.upgrade("relative.sqlite")
    assert migrate.current_revision(tmp_path / "relative.sqlite") == migrate.HEAD_REVISION


def test_current_revision_is_none_for_a_new_file(tmp_path: Path) -> None:
    """A database no migration touched has no current revision."""
    assert migrate.current_revision(tmp_path / "new.sqlite") is None


def test_upgrade_accepts_an_engine_and_leaves_it_usable(tmp_path: Path) -> None:
    """The service layer's engine can be migrated and then used for queries."""
    from sqlalchemy import text

    from admission_plane.store.engine import create_admission_engine

    engine = create_admission_engine(tmp_path / "engine.sqlite")
    try:
        migrate.upgrade(engine)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT MAX(version) FROM schema_migrations")).scalar_one() == 3
    finally:
        engine.dispose()


def test_cli_upgrade_and_downgrade_from_the_project_root(tmp_path: Path) -> None:
    """`alembic -x url=... upgrade head` then `downgrade base` work from the repository root."""
    database = tmp_path / "cli.sqlite"
    upgraded = run_cli("-x", f"url={database}", "upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    assert alembic_version(database) == [migrate.HEAD_REVISION]
    downgraded = run_cli("-x", f"url={database}", "downgrade", "base")
    assert downgraded.returncode == 0, downgraded.stderr
    assert tables(database) == {"alembic_version"}


def test_cli_round_trip_keeps_rows(tmp_path: Path) -> None:
    """Rows written at v1 survive a CLI upgrade, downgrade to v1 and upgrade again."""
    database = tmp_path / "cli-rows.sqlite"
    assert run_cli("-x", f"url={database}", "upgrade", "0001_seed_v1").returncode == 0
    populate(database, 1)
    for step in (("upgrade", "head"), ("downgrade", "0001_seed_v1"), ("upgrade", "head")):
        result = run_cli("-x", f"url={database}", *step)
        assert result.returncode == 0, result.stderr
    assert without_our_columns(snapshot(database)) == expected_rows_after_upgrade(1)


def test_engine_without_explicit_begin_is_refused(tmp_path: Path) -> None:
    """A plain pysqlite engine, with implicit transactions and DDL outside them, is refused before any DDL runs."""
    from sqlalchemy import create_engine

    database = tmp_path / "plain.sqlite"
    engine = create_engine(f"sqlite:///{database}")
    try:
        with pytest.raises(AdmissionMigrationError, match="not inside an explicit transaction"):
            migrate.upgrade(engine)
    finally:
        engine.dispose()
    assert tables(database) == set()
