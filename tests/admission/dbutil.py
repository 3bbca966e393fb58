"""Direct inspection (and corruption) of an admission database, bypassing the service under test.

The contract tests look at rows the way an operator (or an attacker with database access)
would. Every function takes the database the fixtures hand out: an SQLite file path (read
with the stdlib ``sqlite3``, so tests may switch foreign keys off) or a PostgreSQL URL (read
through a cached SQLAlchemy engine with ``postgresql+psycopg``). SQL is written with ``?``
placeholders on both.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from functools import cache
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

TableDump = dict[str, list[tuple[Any, ...]]]
Params = tuple[Any, ...]

_PG_TABLES = (
    "SELECT table_name FROM information_schema.tables "
    "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"
)
_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%' ORDER BY name"


def is_postgres(database: str) -> bool:
    """Whether ``database`` names a PostgreSQL database (anything else is an SQLite file path)."""
    return database.startswith("postgresql")


def libpq_url(url: str) -> str:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL (for ``psycopg.connect``), password kept."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@cache
def pg_engine(url: str) -> Engine:
    """An engine on the PostgreSQL database ``url``, shared by every call of the run."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed, pool_pre_ping=True, pool_size=1)


def _sqlite(path: str, foreign_keys: bool = True) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, timeout=5)
    connection.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
    return connection


def _pg_sql(sql: str) -> str:
    # psycopg's placeholder is %s, so a literal % must be doubled (the statements hold no '?' literals).
    return sql.replace("%", "%%").replace("?", "%s")


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def query(database: str, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
    """All rows of one statement, as plain tuples (``bytea`` read as ``bytes``)."""
    if is_postgres(database):
        with pg_engine(database).begin() as connection:
            found = connection.exec_driver_sql(_pg_sql(sql), params).fetchall()
        return [tuple(_plain(value) for value in row) for row in found]
    with closing(_sqlite(database)) as connection:
        return connection.execute(sql, params).fetchall()


def scalar(database: str, sql: str, params: Params = ()) -> Any:
    """The first column of the first row (``None`` when there is no row)."""
    found = query(database, sql, params)
    return found[0][0] if found else None


def count(database: str, table: str, where: str = "TRUE", params: Params = ()) -> int:
    """``SELECT COUNT(*)`` of ``table`` filtered by ``where``."""
    return scalar(database, f'SELECT COUNT(*) FROM "{table}" WHERE {where}', params)


def execute(database: str, *statements: str, params: Params = (), foreign_keys: bool = True) -> int:
    """Run ``statements`` (DDL or DML, each with ``params``) in one committed transaction.

    ``foreign_keys=False`` lets a test write rows the schema's references would refuse
    (PostgreSQL: ``session_replication_role = replica`` skips the foreign-key triggers).
    Returns the number of changed rows.
    """
    changed = 0
    if is_postgres(database):
        with pg_engine(database).begin() as connection:
            if not foreign_keys:
                connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for statement in statements:
                changed += max(connection.exec_driver_sql(_pg_sql(statement), params).rowcount, 0)
        return changed
    with closing(_sqlite(database, foreign_keys)) as connection:
        connection.execute("BEGIN IMMEDIATE")
        for statement in statements:
            changed += max(connection.execute(statement, params).rowcount, 0)
        connection.execute("COMMIT")
    return changed


def columns(database: str, table: str) -> list[str]:
    """The column names of ``table``, in declaration order."""
    if is_postgres(database):
        return [
            row[0]
            for row in query(
                database,
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
                (table,),
            )
        ]
    return [row[1] for row in query(database, f'PRAGMA table_info("{table}")')]


def table_names(database: str) -> list[str]:
    """Every table of the database (SQLite: ``sqlite_sequence`` included, statistics excluded), by name."""
    return [row[0] for row in query(database, _PG_TABLES if is_postgres(database) else _SQLITE_TABLES)]


def table_dump(database: str) -> TableDump:
    """Every row of every table (``alembic_version`` included), each table's rows sorted.

    Two equal dumps mean an operation left the database exactly as it was.
    """
    return {name: sorted(query(database, f'SELECT * FROM "{name}"'), key=repr) for name in table_names(database)}


def request_state(database: str, request_id: str) -> str | None:
    """``turn_requests.state`` of one request (``None`` when absent)."""
    return scalar(database, "SELECT state FROM turn_requests WHERE request_id = ?", (request_id,))


def lease_phase(database: str, lease_id: str) -> str | None:
    """``leases.phase`` of one lease (``None`` when absent)."""
    return scalar(database, "SELECT phase FROM leases WHERE lease_id = ?", (lease_id,))


def event_kinds(database: str) -> list[tuple[str, str, str]]:
    """``(kind, from_state, to_state)`` of every journal row, in sequence order."""
    return query(database, "SELECT kind, from_state, to_state FROM events ORDER BY event_seq")


_JOURNAL_FAULT = {
    "sqlite": (
        "CREATE TRIGGER abort_event_inserts BEFORE INSERT ON events "
        "BEGIN SELECT RAISE(ABORT, 'journal fault injected'); END",
    ),
    "postgresql": (
        "CREATE FUNCTION abort_event_insert() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'journal fault injected'; END $$",
        "CREATE TRIGGER abort_event_inserts BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION abort_event_insert()",
    ),
}
_CLEAR_JOURNAL_FAULT = {
    "sqlite": ("DROP TRIGGER IF EXISTS abort_event_inserts",),
    "postgresql": (
        "DROP TRIGGER IF EXISTS abort_event_inserts ON events",
        "DROP FUNCTION IF EXISTS abort_event_insert()",
    ),
}


def _dialect(database: str) -> str:
    return "postgresql" if is_postgres(database) else "sqlite"


@contextmanager
def journal_fault(database: str) -> Iterator[None]:
    """Inside the block every journal insert fails in the database (a trigger raising
    ``journal fault injected``), so the writing transaction must roll back."""
    execute(database, *_JOURNAL_FAULT[_dialect(database)])
    try:
        yield
    finally:
        clear_journal_fault(database)


def clear_journal_fault(database: str) -> None:
    """Remove the trigger of :func:`journal_fault` (a no-op when there is none)."""
    execute(database, *_CLEAR_JOURNAL_FAULT[_dialect(database)])


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern that matches ``message`` and nothing else."""
    return f"^{re.escape(message)}$"


def cases_with_sqlite_only(names: Iterable[str], sqlite_only: Mapping[str, str]) -> list[Any]:
    """Parametrize values ``names``, marking those in ``sqlite_only`` (name -> reason) ``sqlite_only``."""
    return [
        pytest.param(name, marks=pytest.mark.sqlite_only(sqlite_only[name])) if name in sqlite_only else name
        for name in names
    ]


__all__ = [
    "MIGRATION_TABLES",
    "POSTGRES_ONLY",
    "cases_with_sqlite_only",
    "clear_journal_fault",
    "columns",
    "count",
    "event_kinds",
    "exactly",
    "execute",
    "is_postgres",
    "journal_fault",
    "lease_phase",
    "pg_engine",
    "query",
    "request_state",
    "reset_postgres",
    "reset_statements",
    "scalar",
    "table_dump",
    "table_names",
]


#: Tables whose rows are the migration's own, kept by the per-test reset.
MIGRATION_TABLES = frozenset({"schema_migrations", "alembic_version"})


@cache
def reset_statements(url: str) -> tuple[str, ...]:
    """What empties the admission tables of ``url`` and restarts its sequences (:func:`reset_postgres`)."""
    sequences = query(url, "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()")
    return (
        *(f'DELETE FROM "{name}"' for name in table_names(url) if name not in MIGRATION_TABLES),
        *(f'ALTER SEQUENCE "{name}" RESTART' for (name,) in sequences),
    )


def reset_postgres(url: str) -> None:
    """Empty every admission table of ``url`` and restart its sequences, keeping the migration's rows.

    ``DELETE`` with foreign keys off, not ``TRUNCATE``: on these few rows it takes ~5 ms where
    ``TRUNCATE ... RESTART IDENTITY CASCADE`` takes 60-250 ms (new relation files, fsync).
    A connection a previous test leaked can hold a lock; after a short wait it is terminated.
    """
    statements = ("SET LOCAL lock_timeout = '2s'", *reset_statements(url))
    try:
        execute(url, *statements, foreign_keys=False)
    except OperationalError:
        query(
            url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        execute(url, *statements, foreign_keys=False)


#: A test of the shared, migrated PostgreSQL database only (no SQLite variant).
POSTGRES_ONLY = pytest.mark.parametrize(
    "database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
