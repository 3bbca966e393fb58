"""Direct inspection of an admission database file with the standard-library ``sqlite3``.

The contract tests look at rows the way an operator (or an attacker with file access)
would: straight through SQLite, never through the service layer under test.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from typing import Any

TableDump = dict[str, list[tuple[Any, ...]]]


def connect(path: str) -> sqlite3.Connection:
    """An autocommit connection to the database file (foreign keys on, as the plane runs)."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=5)
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


def table_dump(path: str) -> TableDump:
    """Every row of every table (``sqlite_sequence`` and ``alembic_version`` included), sorted.

    Two equal dumps mean an operation left the database exactly as it was.
    """
    with closing(connect(path)) as connection:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%' ORDER BY name"
            )
        ]
        return {
            name: sorted(connection.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr) for name in names
        }


def query(path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """All rows of one statement."""
    with closing(connect(path)) as connection:
        return connection.execute(sql, params).fetchall()


def scalar(path: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row (``None`` when there is no row)."""
    rows = query(path, sql, params)
    return rows[0][0] if rows else None


def count(path: str, table: str, where: str = "1", params: tuple[Any, ...] = ()) -> int:
    """``SELECT COUNT(*)`` of ``table`` filtered by ``where``."""
    return scalar(path, f"SELECT COUNT(*) FROM {table} WHERE {where}", params)


def execute(path: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Run one statement (DDL or DML) in its own transaction; return the changed row count."""
    with closing(connect(path)) as connection:
        return connection.execute(sql, params).rowcount


def request_state(path: str, request_id: str) -> str | None:
    """``turn_requests.state`` of one request (``None`` when absent)."""
    return scalar(path, "SELECT state FROM turn_requests WHERE request_id = ?", (request_id,))


def event_kinds(path: str) -> list[tuple[str, str, str]]:
    """``(kind, from_state, to_state)`` of every journal row, in sequence order."""
    return query(path, "SELECT kind, from_state, to_state FROM events ORDER BY event_seq")


ABORT_EVENT_INSERTS = (
    "CREATE TRIGGER abort_event_inserts BEFORE INSERT ON events "
    "BEGIN SELECT RAISE(ABORT, 'journal fault injected'); END"
)
DROP_ABORT_EVENT_INSERTS = "DROP TRIGGER abort_event_inserts"


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern that matches ``message`` and nothing else."""
    return f"^{re.escape(message)}$"
