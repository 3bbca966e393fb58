"""Statements built once from the entities, compiled once per dialect, run on the driver's cursor.

Why: one turn is six write transactions of a few statements each, and the time goes
into Python, not the database (SPEC-NOTES §5: building and compiling statements per
call, cache-key generation and result wrapping cost more than SQLite's own work). So
every hot-path statement is a SQLAlchemy construct over the ORM entities (the schema
stays declared in one place), compiled to SQL text once per dialect with named
parameters, and executed on the transaction's DB-API cursor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable

from ._doorbell import Chimes

_SQLITE_NAMED = sqlite.dialect(paramstyle="named")


class Statement:
    """A construct and its compiled SQL per dialect (named parameters, dict arguments).

    Bind parameters that carry their own value (``limit(1)``, ``values(x=None)``) become
    per-statement defaults; named ``bindparam("x")`` parameters must be supplied per call.
    """

    __slots__ = ("_compiled", "_constructs")

    def __init__(self, construct: Executable, **per_dialect: Executable) -> None:
        self._constructs: dict[str, Executable] = {"default": construct, **per_dialect}
        self._compiled: dict[str, tuple[str, dict[str, Any]]] = {}

    def compiled(self, dialect: Dialect) -> tuple[str, dict[str, Any]]:
        """The SQL text for ``dialect`` and its default parameters (compiled on first use)."""
        name = dialect.name
        entry = self._compiled.get(name)
        if entry is None:
            construct = self._constructs.get(name, self._constructs["default"])
            target = _SQLITE_NAMED if name == "sqlite" else dialect
            compiled = construct.compile(dialect=target)
            defaults = {
                compiled.bind_names[bind]: bind.effective_value
                for bind in compiled.binds.values()
                if not bind.required
            }
            entry = (str(compiled), defaults)
            self._compiled[name] = entry
        return entry

    def sql(self, dialect: Dialect) -> str:
        """The SQL text for ``dialect``."""
        return self.compiled(dialect)[0]


class Tx:
    """The statements of one unit of work, executed on a DB-API connection's cursor."""

    __slots__ = ("_cursor", "dialect", "rings")

    def __init__(self, dbapi_connection: Any, dialect: Dialect) -> None:
        self.dialect = dialect
        self._cursor: Any = dbapi_connection.cursor()
        #: What this transaction adds to the admission doorbell, announced once it commits.
        self.rings = Chimes()

    def ring(self, bells: int) -> None:
        """Add ``bells`` (:class:`~admission_plane._doorbell.Bell` flags) once more to what this
        transaction announces to waiting connectors when it commits (two requests timed out
        in one transaction are two departures)."""
        self.rings = self.rings.plus(Chimes.of(bells))

    def begin(self, sql: str) -> None:
        """Open the transaction explicitly (SQLite: ``BEGIN`` or ``BEGIN IMMEDIATE``)."""
        self._cursor.execute(sql)

    def _run(self, statement: Statement, params: Mapping[str, Any] | None) -> Any:
        sql, defaults = statement.compiled(self.dialect)
        if defaults:
            params = {**defaults, **params} if params else defaults
        cursor = self._cursor
        cursor.execute(sql, params or {})
        return cursor

    def execute(self, statement: Statement, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement; return its row count."""
        return self._run(statement, params).rowcount

    def one(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Sequence[Any] | None:
        """The first row, or ``None``."""
        return self._run(statement, params).fetchone()

    def scalar(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row, or ``None``."""
        row = self.one(statement, params)
        return None if row is None else row[0]

    def all(self, statement: Statement, params: Mapping[str, Any] | None = None) -> list[Sequence[Any]]:
        """Every row."""
        return self._run(statement, params).fetchall()

    def close(self) -> None:
        self._cursor.close()
