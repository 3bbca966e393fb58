"""Fixtures for the admission plane: real SQLite files or a real PostgreSQL database, migrated by Alembic.

Migrating costs more than most tests, so it happens once per run and dialect: SQLite tests get
a copy of a migrated template file, PostgreSQL tests share one migrated database that is
emptied (``TRUNCATE``) before each test. Tests that change the schema itself use
``postgres_url`` (a fresh database per test) or their own files instead.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from dbutil import clear_journal_fault, pg_engine, table_names
from planes import CONTENT_KEY, CONTRACT_POLICY, ENCRYPTION_KEY
from sqlalchemy.exc import OperationalError

from admission_plane import AdmissionPlane

#: Tables whose rows are the migration's own, kept by the per-test reset.
MIGRATION_TABLES = frozenset({"schema_migrations", "alembic_version"})
DIALECTS = ["sqlite"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sqlite_only(reason): the test needs SQLite itself; its PostgreSQL variant is skipped with reason"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("sqlite_only")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None or callspec.params.get("database_url") != "postgresql":
            continue
        reason = marker.args[0] if marker.args else marker.kwargs["reason"]
        item.add_marker(pytest.mark.skip(reason=f"SQLite only: {reason}"))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file migrated to Alembic head once per run, checkpointed so the main file is complete."""
    from admission_plane.migrate import upgrade

    path = tmp_path_factory.mktemp("template") / "admission.sqlite"
    upgrade(str(path))
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture(scope="session")
def postgres_database(postgres_session_url: str) -> str:
    """The run's PostgreSQL database, migrated to Alembic head once."""
    from admission_plane.migrate import upgrade

    upgrade(postgres_session_url)
    return postgres_session_url


def reset_postgres(url: str) -> None:
    """Empty every admission table of ``url`` (identities restarted), keeping the migration's rows.

    A connection a previous test leaked can hold a lock; after a short wait it is terminated.
    """
    clear_journal_fault(url)
    tables = ", ".join(f'"{name}"' for name in table_names(url) if name not in MIGRATION_TABLES)
    truncate = f"TRUNCATE {tables} RESTART IDENTITY CASCADE"
    with pg_engine(url).connect() as connection:
        connection.exec_driver_sql("SET lock_timeout = '2s'")
        try:
            connection.exec_driver_sql(truncate)
        except OperationalError:
            connection.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            connection.exec_driver_sql(truncate)
        finally:
            connection.exec_driver_sql("RESET lock_timeout")


@pytest.fixture(params=DIALECTS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database at Alembic head: a real SQLite file path, or a PostgreSQL URL."""
    if request.param == "sqlite":
        path = tmp_path / "admission.sqlite"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return str(path)
    url = request.getfixturevalue("postgres_database")
    reset_postgres(url)
    return url


@pytest.fixture
def make_plane(database_url: str) -> Iterator[Callable[..., AdmissionPlane]]:
    """Open planes on the test database (keys set, contract policy by default); all closed afterwards."""
    opened: list[AdmissionPlane] = []

    def factory(**options: Any) -> AdmissionPlane:
        options.setdefault("policy", CONTRACT_POLICY)
        options.setdefault("encryption_key", ENCRYPTION_KEY)
        options.setdefault("content_fingerprint_key", CONTENT_KEY)
        plane = AdmissionPlane(options.pop("database", database_url), **options)
        opened.append(plane)
        return plane

    yield factory
    for plane in opened:
        plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane with the contract policy and both keys."""
    return make_plane()
