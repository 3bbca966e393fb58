"""Fixtures for the admission plane: real SQLite files or a real PostgreSQL database, migrated by Alembic.

Migrating costs more than most tests, so it happens once per run and dialect: SQLite tests get
a copy of a migrated template file, PostgreSQL tests share one migrated database that is
emptied before each test. Tests that change the schema itself use
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
from dbutil import execute, reset_postgres, reset_statements, scalar
from planes import CONTENT_KEY, CONTRACT_POLICY, ENCRYPTION_KEY, ONE_SEAT

from admission_plane import AdmissionPlane
from admission_plane.service._context import PlaneContext
from admission_plane.store.unit_of_work import SentUnitRefused

DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
#: Everything of the schema a test could change by mistake: columns, constraints, indexes, triggers.
SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(item, ',' ORDER BY item)) FROM (
    SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull AS item
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    WHERE c.relnamespace = current_schema()::text::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
    WHERE connamespace = current_schema()::text::regnamespace
    UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = current_schema()::text::regnamespace AND NOT t.tgisinternal
    UNION ALL SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = current_schema()::text::regnamespace
) AS schema_items
"""


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
def postgres_database(postgres_session_url: str) -> tuple[str, str]:
    """The run's PostgreSQL database, migrated to Alembic head once, and the fingerprint of its schema."""
    from admission_plane.migrate import upgrade

    upgrade(postgres_session_url)
    return postgres_session_url, scalar(postgres_session_url, SCHEMA_FINGERPRINT)


def rebuild_postgres(url: str) -> None:
    """Drop everything in the schema of ``url`` and migrate it again (after a test changed the schema)."""
    from admission_plane.migrate import upgrade

    execute(url, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
    reset_statements.cache_clear()
    upgrade(url)


@pytest.fixture(params=DIALECTS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database at Alembic head: a real SQLite file path, or a PostgreSQL URL."""
    if request.param == "sqlite":
        path = tmp_path / "admission.sqlite"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield str(path)
        return
    url, fingerprint = request.getfixturevalue("postgres_database")
    reset_postgres(url)
    yield url
    if scalar(url, SCHEMA_FINGERPRINT) != fingerprint:
        rebuild_postgres(url)
        pytest.fail("the test changed the shared PostgreSQL schema (use postgres_url for that)", pytrace=False)


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


@pytest.fixture
def one_seat(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane with one seat, one start and no start interval, and both keys."""
    return make_plane(policy=ONE_SEAT)


@pytest.fixture
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How many units the server refused, each of which ``PlaneContext.run_sent`` runs again the long way."""
    ran: list[str] = []
    original = PlaneContext.run

    def counted(self: PlaneContext, work: Callable[..., Any], **options: Any) -> Any:
        try:
            return original(self, work, **options)
        except SentUnitRefused:
            ran.append("long way")
            raise

    monkeypatch.setattr(PlaneContext, "run", counted)
    return ran


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement sent through psycopg's ``Cursor.execute`` (a round trip each), in order."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, params, **options)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return sent
