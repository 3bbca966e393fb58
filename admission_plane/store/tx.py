"""Statements built once from the entities, compiled once per dialect, run on the driver's cursor.

Why: one turn is six write transactions of a few statements each, and the time goes into
Python, not the database: building and compiling statements per call, cache-key
generation and result wrapping cost more than SQLite's own work. So every hot-path
statement is a SQLAlchemy construct over the ORM entities (the schema stays declared in
one place), compiled to SQL text once per dialect with named parameters, and executed on
the transaction's DB-API cursor.

A :class:`Query` names the record its rows become (:mod:`admission_plane.store.rows`,
built and checked by its ``from_row``);
the record's fields must be the query's column labels, in order, which is checked when
the query is defined, so no caller ever reads a row by position.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeAlias, TypeVar

import attrs
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.interfaces import DBAPIConnection, DBAPICursor
from sqlalchemy.sql import Select
from sqlalchemy.sql.expression import UpdateBase

from .doorbell import Chimes
from .rows import Row
from .session_functions import FUNCTIONS_KEY

_SQLITE_NAMED = sqlite.dialect(paramstyle="named")

#: A ``SELECT`` of any columns (SQLAlchemy types a select by its column types).
AnySelect: TypeAlias = "Select[*tuple[Any, ...]]"
#: What a :class:`Statement` compiles: a ``SELECT``, ``INSERT``, ``UPDATE`` or ``DELETE``.
Construct: TypeAlias = "AnySelect | UpdateBase"

R = TypeVar("R", bound=Row)
V = TypeVar("V")


class Statement:
    """A construct and its compiled SQL per dialect (named parameters, dict arguments).

    Bind parameters that carry their own value (``limit(1)``, ``values(x=None)``) become
    per-statement defaults; named ``bindparam("x")`` parameters must be supplied per call.
    """

    __slots__ = ("_compiled", "_constructs", "only")

    def __init__(self, construct: Construct, *, only: str | None = None, **per_dialect: Construct) -> None:
        self._constructs: dict[str, Construct] = {"default": construct, **per_dialect}
        self._compiled: dict[str, tuple[str, dict[str, Any]]] = {}
        #: The one dialect the statement is written for (``None``: every dialect).
        self.only = only

    def supports(self, dialect: Dialect) -> bool:
        """Whether the statement can run on ``dialect``."""
        return self.only is None or self.only == dialect.name

    def compiled(self, dialect: Dialect) -> tuple[str, dict[str, Any]]:
        """The SQL text for ``dialect`` and its default parameters (compiled on first use)."""
        name = dialect.name
        entry = self._compiled.get(name)
        if entry is None:
            if not self.supports(dialect):
                raise ValueError(f"statement is written for {self.only}, not {name}")
            construct = self._constructs.get(name, self._constructs["default"])
            target = _SQLITE_NAMED if name == "sqlite" else dialect
            compiled = construct.compile(dialect=target)
            defaults = {
                compiled.bind_names[bind]: bind.effective_value for bind in compiled.binds.values() if not bind.required
            }
            entry = (str(compiled), defaults)
            self._compiled[name] = entry
        return entry

    def sql(self, dialect: Dialect) -> str:
        """The SQL text for ``dialect``."""
        return self.compiled(dialect)[0]

    @property
    def construct(self) -> Construct:
        """The construct compiled for every dialect without one of its own."""
        return self._constructs["default"]


class Query(Statement, Generic[R]):
    """A ``SELECT`` whose rows become ``record`` values.

    Raises :class:`TypeError` at definition when the record's attrs fields are not the
    select's column labels in order.
    """

    __slots__ = ("record",)

    def __init__(
        self, construct: AnySelect, record: type[R], *, only: str | None = None, **per_dialect: Construct
    ) -> None:
        super().__init__(construct, only=only, **per_dialect)
        labels = tuple(column.key for column in construct.selected_columns)
        fields = tuple(field.name for field in attrs.fields(record))
        if labels != fields:
            raise TypeError(f"{record.__name__} fields {fields} are not the query's columns {labels}")
        self.record: type[R] = record


class Scalar(Statement, Generic[V]):
    """A ``SELECT`` of one value (a count, a flag, a timestamp); ``V`` is its Python type."""

    __slots__ = ()


class Tx:
    """The statements of one unit of work, executed on a DB-API connection's cursor.

    :meth:`send` runs a statement whose result nobody reads, and :meth:`defer` one that nothing
    in the transaction reads back; on PostgreSQL, in a unit's transaction, both are held back and
    ride on a later round trip (see each).
    """

    __slots__ = ("_connection", "_cursor", "_deferred", "_pending", "dialect", "functions", "rings", "shared")

    def __init__(
        self, dbapi_connection: DBAPIConnection, dialect: Dialect, *, shared: bool = False, batched: bool = False
    ) -> None:
        self.dialect = dialect
        self._connection = dbapi_connection
        self._cursor: DBAPICursor = dbapi_connection.cursor()
        #: PostgreSQL, inside a transaction the unit commits: what :meth:`send` and :meth:`defer` hold
        #: back (``None``: nothing is held back, every statement runs at once).
        self._pending: list[tuple[Statement, Mapping[str, Any] | None]] | None = [] if batched else None
        self._deferred: list[tuple[Statement, Mapping[str, Any] | None]] = []
        #: What this transaction adds to the admission doorbell, announced once it commits.
        self.rings = Chimes()
        #: Whether this unit may run beside other lease units (PostgreSQL's shared gate; see
        #: :mod:`admission_plane.store.unit_of_work`): it must then lock what it relies on.
        self.shared = shared
        #: PostgreSQL: whether the connection holds the admission index functions
        #: (:mod:`admission_plane.store.session_functions`).
        info = getattr(dbapi_connection, "info", None)  # the pool record's (a raw driver connection: no functions)
        self.functions: bool = isinstance(info, dict) and info.get(FUNCTIONS_KEY) is True

    def defer(self, statement: Statement, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement nothing in the transaction reads back (the journal's insert): PostgreSQL, in a
        unit's transaction, at commit, in the commit's round trip after every held-back :meth:`send`;
        otherwise at once. It runs before ``COMMIT``, inside the transaction: if it fails, the transaction
        rolls back and the unit fails as if it had run at once."""
        if self._pending is None:
            self._run(statement, params)
        else:
            self._deferred.append((statement, params))

    def ring(self, bells: int) -> None:
        """Add ``bells`` (:class:`~admission_plane.store.doorbell.Bell` flags) once more to what
        this transaction announces to waiting connectors when it commits (two requests timed out
        in one transaction are two departures)."""
        if bells:
            self.rings = self.rings.plus(Chimes.of(bells))

    def begin(self, sql: str) -> None:
        """Open the transaction explicitly (SQLite: ``BEGIN`` or ``BEGIN IMMEDIATE``)."""
        self._cursor.execute(sql)

    def command(self, sql: str) -> None:
        """PostgreSQL: run constant, parameterless SQL text, several statements at once (``BEGIN;
        SELECT pg_advisory_xact_lock(...)``), in one round trip of the simple query protocol."""
        cursor: Any = self._cursor
        cursor.execute(sql, prepare=False)

    def _run(self, statement: Statement, params: Mapping[str, Any] | None) -> DBAPICursor:
        if self._pending:
            self._flush()
        sql, defaults = statement.compiled(self.dialect)
        if defaults:
            params = {**defaults, **params} if params else defaults
        cursor = self._cursor
        cursor.execute(sql, params or {})
        return cursor

    def send(self, statement: Statement, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement whose result is not read.

        PostgreSQL, in a unit's transaction: it is held back until the next statement, which sends
        it first (so every statement still sees it), or until the commit, whose round trip then
        carries it as literal text (:meth:`closing`): a unit that ends with writes nobody reads pays
        no round trip for them. Its failure (a constraint) surfaces there instead of here, and fails
        the unit the same way; nothing in the library catches a ``send``'s error.
        """
        if self._pending is not None:
            self._pending.append((statement, params))
            return
        self._run(statement, params)

    def _flush(self) -> None:
        pending = self._pending or []
        self._pending = []
        for statement, params in pending:
            self._run(statement, params)

    def closing(self) -> list[str]:
        """PostgreSQL: the statements the commit's round trip carries before ``COMMIT``, with their values
        as literals (quoted by the driver): the sends still held back, then the deferred ones."""
        held = [*(self._pending or ()), *self._deferred]
        self._pending, self._deferred = ([] if self._pending is not None else None), []
        if not held:
            return []
        from psycopg import ClientCursor  # only PostgreSQL units hold statements back

        raw: Any = getattr(self._connection, "dbapi_connection", self._connection)
        with ClientCursor(raw) as cursor:
            texts = []
            for statement, params in held:
                sql, defaults = statement.compiled(self.dialect)
                texts.append(cursor.mogrify(sql, {**defaults, **params} if params else defaults))
        return texts

    def execute(self, statement: Statement, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement; return its row count."""
        return self._run(statement, params).rowcount

    def one(self, query: Query[R], params: Mapping[str, Any] | None = None) -> R | None:
        """The first row as a record, or ``None``."""
        row = self._run(query, params).fetchone()
        return None if row is None else query.record.from_row(row)

    def row(self, statement: Statement, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        """The first row as a plain tuple, or ``None`` (for a statement of counts, not a record)."""
        row = self._run(statement, params).fetchone()
        return None if row is None else tuple(row)

    def all(self, query: Query[R], params: Mapping[str, Any] | None = None) -> list[R]:
        """Every row, as records."""
        from_row = query.record.from_row
        return [from_row(row) for row in self._run(query, params).fetchall()]

    def scalar(self, query: Scalar[V], params: Mapping[str, Any] | None = None) -> V | None:
        """The first column of the first row, or ``None``."""
        row = self._run(query, params).fetchone()
        return None if row is None else row[0]

    def column(self, query: Scalar[V], params: Mapping[str, Any] | None = None) -> list[V]:
        """The first column of every row."""
        return [row[0] for row in self._run(query, params).fetchall()]

    def exists(self, query: Scalar[Any], params: Mapping[str, Any] | None = None) -> bool:
        """Whether the query returns a row."""
        return self._run(query, params).fetchone() is not None

    def close(self) -> None:
        """Close the cursor (the connection stays with its unit of work)."""
        self._cursor.close()
