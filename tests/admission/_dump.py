"""Direct reads and corruptions of an admission SQLite file with the stdlib driver.

``table_dump`` and ``exactly`` come from the shared :mod:`dbutil`.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from dbutil import exactly, table_dump


def rows(path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """All rows of one query."""
    with closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql, params).fetchall()


def scalar(path: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of one query (``None`` without a row)."""
    found = rows(path, sql, params)
    return found[0][0] if found else None


def execute(path: str, *statements: str, foreign_keys: bool = True) -> None:
    """Run ``statements`` in one committed transaction, bypassing the service (to corrupt rows)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        connection.execute("BEGIN IMMEDIATE")
        for statement in statements:
            connection.execute(statement)
        connection.execute("COMMIT")


def events(path: str) -> list[tuple[str, str, str]]:
    """The journal as ``(kind, from_state, to_state)`` in order."""
    return [tuple(row) for row in rows(path, "SELECT kind, from_state, to_state FROM events ORDER BY event_seq")]


def event_times(path: str) -> list[int]:
    """The journal's ``occurred_at`` values in order."""
    return [row[0] for row in rows(path, "SELECT occurred_at FROM events ORDER BY event_seq")]


def request_state(path: str, request_id: str) -> str | None:
    return scalar(path, "SELECT state FROM turn_requests WHERE request_id = ?", (request_id,))


def lease_phase(path: str, lease_id: str) -> str | None:
    return scalar(path, "SELECT phase FROM leases WHERE lease_id = ?", (lease_id,))


def count(path: str, table: str, where: str = "1", params: tuple[Any, ...] = ()) -> int:
    return scalar(path, f'SELECT COUNT(*) FROM "{table}" WHERE {where}', params)


__all__ = ["count", "event_times", "events", "exactly", "execute", "lease_phase", "request_state", "rows", "scalar",
           "table_dump"]
