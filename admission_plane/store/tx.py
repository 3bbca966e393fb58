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

import functools
import logging
import re
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

_LOG = logging.getLogger(__name__)
#: Key of a pooled connection's ``info``: the statements prepared on it by name (:meth:`Tx._prepared`).
PREPARED_KEY = "admission_plane_prepared"
#: Key of a pooled PostgreSQL connection's ``info``: the cursor its units share (:func:`_kept_cursor`).
CURSOR_KEY = "admission_plane_cursor"
_GENERATION_KEY = "admission_plane_prepared_generation"
#: A named parameter of a compiled PostgreSQL statement (``pyformat``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

_SQLITE_NAMED = sqlite.dialect(paramstyle="named")
#: :meth:`Tx.closing`: a statement :meth:`Tx._prepared` has not decided on yet.
_UNKNOWN: Any = object()

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


def plain_literal(value: object) -> str | None:
    """``value`` as the SQL literal psycopg's ``ClientCursor`` writes for it, for the values whose literal does
    not depend on the connection: ``None``, booleans, integers, and text without a backslash or a zero byte
    (quotes doubled, as ``PQescapeLiteral`` writes it), their subclasses (``StrEnum`` states) as the driver
    dumps them, by value; ``None`` for any other value (the driver quotes it)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        number = int(value)
        return str(number) if number >= 0 else f" {number}"  # the driver's space: no ``--`` after a minus
    if isinstance(value, str):
        text = str.__str__(value)
        return None if "\\" in text or "\0" in text else "'" + text.replace("'", "''") + "'"
    return None


def plain_literals(values: list[Any], *, bytea: bool = False) -> list[str] | None:
    """``[plain_literal(value) for value in values]``, or ``None`` as soon as one value has no plain literal.

    The hot path of every PostgreSQL commit (:meth:`Tx.closing` writes about thirty values a unit): text and
    integers of their exact types are written here without a call per value; every other value goes through
    :func:`plain_literal`, so the two always agree. With ``bytea`` (the connection has
    ``standard_conforming_strings`` on, where the driver writes ``bytes`` as ``'\\x<hex>'::bytea``), values of
    the exact type ``bytes`` are written that way too (a sealed prompt's nonce, ciphertext and tag)."""
    literals: list[str] = []
    append = literals.append
    for value in values:
        kind = type(value)
        if kind is str:
            if "\\" in value or "\0" in value:
                return None
            append("'" + (value.replace("'", "''") if "'" in value else value) + "'")
        elif kind is int:
            append(str(value) if value >= 0 else f" {value}")
        elif kind is bytes and bytea:
            append("'\\x" + value.hex() + "'::bytea")
        else:
            literal = plain_literal(value)
            if literal is None:
                return None
            append(literal)
    return literals


@functools.lru_cache(maxsize=1024)
def _execute_text(name: str, parameters: int) -> str:
    """``EXECUTE name(%s, ...)`` for a statement prepared by name with ``parameters`` parameters."""
    return f"EXECUTE {name}({', '.join(['%s'] * parameters)})" if parameters else f"EXECUTE {name}"


def _kept_cursor(dbapi_connection: Any, info: Any) -> Any:
    """PostgreSQL: the cursor kept in a pooled connection's ``info`` for every unit on it (made at the first),
    or ``None`` for a connection without pool record. Each unit runs every statement on it and reads each
    result before the next statement, as on a cursor of its own; keeping one spares creating a driver cursor
    per unit. The pool clears ``info`` when the connection is closed or invalidated, and a cursor is used only
    with the connection that made it."""
    raw = getattr(dbapi_connection, "dbapi_connection", None)
    if raw is None or not isinstance(info, dict):
        return None
    cursor = info.get(CURSOR_KEY)
    if cursor is None or cursor.connection is not raw or cursor.closed:
        cursor = info[CURSOR_KEY] = raw.cursor()
    return cursor


class Returned:
    """The first row of a statement sent with :meth:`Tx.send_returning`, once the round trip that ran it is over
    (``row``: ``None`` when it returned none; ``ran``: whether it has run)."""

    __slots__ = ("ran", "row")

    def __init__(self) -> None:
        self.row: tuple[Any, ...] | None = None
        self.ran = False


#: A statement held back by :meth:`Tx.send`: its parameters, and where its row goes (``None``: nowhere).
_Held: TypeAlias = "tuple[Statement, Mapping[str, Any] | None, Returned | None]"


class Tx:
    """The statements of one unit of work, executed on a DB-API connection's cursor.

    :meth:`send` runs a statement whose result nobody reads, and :meth:`defer` one that nothing
    in the transaction reads back; on PostgreSQL, in a unit's transaction, both are held back and
    ride on a later round trip (see each).
    """

    __slots__ = (
        "_connection",
        "_cursor",
        "_deferred",
        "_kept_cursor",
        "_opening",
        "_pending",
        "_returning",
        "_unprepared",
        "count_neutral",
        "dialect",
        "functions",
        "rings",
        "shared",
    )

    def __init__(
        self, dbapi_connection: DBAPIConnection, dialect: Dialect, *, shared: bool = False, batched: bool = False
    ) -> None:
        self.dialect = dialect
        self._connection = dbapi_connection
        info = getattr(dbapi_connection, "info", None)  # the pool record's (a raw driver connection: no functions)
        #: PostgreSQL, a pooled connection: its one cursor, kept with it from unit to unit (``None``: this
        #: transaction's own cursor, closed by :meth:`close`).
        self._kept_cursor: Any = _kept_cursor(dbapi_connection, info) if dialect.name == "postgresql" else None
        self._cursor: DBAPICursor = self._kept_cursor or dbapi_connection.cursor()
        #: PostgreSQL, inside a transaction the unit commits: what :meth:`send` and :meth:`defer` hold
        #: back (``None``: nothing is held back, every statement runs at once).
        self._pending: list[_Held] | None = [] if batched else None
        #: PostgreSQL: where the rows of statements the commit carries go (their result's place in it).
        self._returning: list[tuple[int, Returned]] = []
        self._deferred: list[tuple[Statement, Mapping[str, Any] | None]] = []
        #: PostgreSQL: the transaction's opening (``BEGIN`` and its gates) and how many statements it holds,
        #: until the first statement carries it (:meth:`open`).
        self._opening: tuple[str, int] | None = None
        #: PostgreSQL: statements the commit carried as literal text because they were not prepared on the
        #: connection yet; :meth:`prepare_carried` prepares them once the transaction is over.
        self._unprepared: list[str] = []
        #: PostgreSQL, a lease unit: set by an operation whose writes change nothing admission counts or reads
        #: (:mod:`admission_plane.store.unit_of_work`); the unit then commits without the admission gate.
        self.count_neutral = False
        #: What this transaction adds to the admission doorbell, announced once it commits.
        self.rings = Chimes()
        #: Whether this unit may run beside other lease units (PostgreSQL's shared gate; see
        #: :mod:`admission_plane.store.unit_of_work`): it must then lock what it relies on.
        self.shared = shared
        #: PostgreSQL: whether the connection holds the admission index functions
        #: (:mod:`admission_plane.store.session_functions`).
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

    def open(self, sql: str, statements: int) -> None:
        """PostgreSQL: open the transaction with ``sql``, constant text of ``statements`` statements (``BEGIN``
        and the unit's gates), sent with the unit's first statement in one round trip of the simple query
        protocol, as ``EXECUTE`` of that statement prepared by name on the connection (:meth:`_prepared`),
        or with the commit if no statement runs before it. Nothing the opening does is seen by anyone before
        the first statement runs, so holding it back changes no outcome."""
        self._opening = (sql, statements)

    def command(self, sql: str) -> None:
        """PostgreSQL: run constant, parameterless SQL text, several statements at once (``BEGIN;
        SELECT pg_advisory_xact_lock(...)``), in one round trip of the simple query protocol."""
        self._simple(sql)

    def _simple(self, sql: str) -> Any:
        """PostgreSQL: run ``sql`` (several statements, values as literals) in one round trip of the simple
        query protocol, past psycopg's cache of statements to prepare; return the cursor.

        Why past the cache: the text holds this unit's values, so it is new every time, and psycopg would
        still count it in its cache and read every statement's result for a ``ROLLBACK`` that could drop its
        prepared statements (about 6 % of a connector's CPU). Neither can matter here: no text of the plane
        holds ``ROLLBACK``, ``DROP``, ``ALTER``, ``DISCARD`` or ``DEALLOCATE``, and a statement that fails
        ends the round trip there (the rest, ``COMMIT`` included, never runs), after which the unit rolls
        back through the driver's ``rollback``, which forgets the prepared statements as before
        (:meth:`forget_prepared`)."""
        cursor: Any = self._cursor
        raw: Any = cursor.connection
        threshold = raw.prepare_threshold
        raw.prepare_threshold = None  # the cache is skipped while it is off (psycopg's PrepareManager)
        try:
            cursor.execute(sql, prepare=False)
        finally:
            raw.prepare_threshold = threshold
        return cursor

    def _run(self, statement: Statement, params: Mapping[str, Any] | None) -> DBAPICursor:
        if self._pending:
            self._flush()
        sql, defaults = statement.compiled(self.dialect)
        if defaults:
            params = {**defaults, **params} if params else defaults
        cursor: Any = self._cursor
        if self._opening is not None:
            (opening, results), self._opening = self._opening, None
            prepared = self._prepared(sql)
            if prepared is None:  # no session state to rely on, or a statement the server cannot prepare alone
                self._simple(opening)
            else:
                name, names = prepared
                values = [(params or {})[each] for each in names]
                arguments = self._literals([(f"({', '.join(['%s'] * len(names))})", values)])[0] if names else ""
                self._simple(f"{opening}; EXECUTE {name}{arguments}")
                for _ in range(results):  # to the statement's own result
                    cursor.nextset()
                return cursor  # type: ignore[no-any-return]
        cursor.execute(sql, params or {})
        return cursor  # type: ignore[no-any-return]

    def send(self, statement: Statement, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement whose result is not read.

        PostgreSQL, in a unit's transaction: it is held back until the next statement, which sends
        it first (so every statement still sees it), or until the commit, whose round trip then
        carries it as literal text (:meth:`closing`): a unit that ends with writes nobody reads pays
        no round trip for them. Its failure (a constraint) surfaces there instead of here, and fails
        the unit the same way; nothing in the library catches a ``send``'s error.
        """
        if self._pending is not None:
            self._pending.append((statement, params, None))
            return
        self._run(statement, params)

    def send_returning(self, statement: Statement, params: Mapping[str, Any] | None = None) -> Returned:
        """:meth:`send` a statement whose first row is read once it ran: at the next statement, or after the
        commit that carried it (PostgreSQL; elsewhere at once). The unit must not need the row before it
        commits; a check the statement makes on the server (``pg_temp.admission_plane_expect_sent``) is what
        keeps the unit from committing when the row is not what it assumed."""
        returned = Returned()
        if self._pending is not None:
            self._pending.append((statement, params, returned))
        else:
            self._keep(self._run(statement, params), returned)
        return returned

    @staticmethod
    def _keep(cursor: Any, returned: Returned) -> None:
        row = cursor.fetchone()
        returned.row, returned.ran = (None if row is None else tuple(row)), True

    def flush(self) -> None:
        """PostgreSQL: run the :meth:`send` statements held back now (the opening with them, if no statement
        carried it yet), so what follows in the unit sees them written and their row locks held; :meth:`defer`
        ones still wait for the commit. Nothing held back (or SQLite): nothing to do."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        pending = self._pending or []
        self._pending = []
        for statement, params, returned in pending:
            cursor = self._run(statement, params)
            if returned is not None:
                self._keep(cursor, returned)

    def closing(self, *before_deferred: str) -> list[str]:
        """PostgreSQL: the statements the commit's round trip carries before ``COMMIT``, with their values
        as literals (quoted by the driver): the opening if no statement carried it (:meth:`open`), then
        the sends still held back, then ``before_deferred`` (constant text: a lease unit's admission gate,
        taken after the lease row its first send may lock, as every lease unit takes them), then the
        deferred ones.

        A statement already prepared by name on the connection is carried as ``EXECUTE`` of it, so the
        server neither analyses nor plans it again (it reuses the generic plan); one not prepared yet is
        carried as its own text and noted for :meth:`prepare_carried`. It is never prepared here: a
        ``PREPARE`` the server refuses inside the transaction would abort it."""
        sends, deferred = list(self._pending or ()), [(statement, params, None) for statement, params in self._deferred]
        self._pending, self._deferred = ([] if self._pending is not None else None), []
        opening = () if self._opening is None else (self._opening[0],)
        first = 0 if self._opening is None else self._opening[1]  # the opening's statements come first
        self._opening = None
        self._returning = [(first + place, held[2]) for place, held in enumerate(sends) if held[2] is not None]
        texts = self._literals(self._carried([*sends, *deferred]))
        return [*opening, *texts[: len(sends)], *before_deferred, *texts[len(sends) :]]

    def carried_rows(self) -> None:
        """PostgreSQL, right after the round trip of :meth:`closing`'s texts: read the rows of the statements
        it carried for :meth:`send_returning` (each statement of the round trip has one result, in order)."""
        returning, self._returning = self._returning, []
        cursor: Any = self._cursor
        position = 0
        for place, returned in returning:
            while position < place:
                cursor.nextset()
                position += 1
            self._keep(cursor, returned)

    def _carried(self, held: list[_Held]) -> list[tuple[str, Any]]:
        """``held`` as the texts a commit carries and their values (:meth:`closing`), one per statement."""
        known = self._known_prepared()
        texts: list[tuple[str, Any]] = []
        for statement, params, _returned in held:
            sql, defaults = statement.compiled(self.dialect)
            values = {**defaults, **params} if params else defaults
            prepared = None if known is None else known.get(sql, _UNKNOWN)
            if prepared is _UNKNOWN:
                self._unprepared.append(sql)
            elif prepared is not None:
                name, names = prepared
                texts.append((_execute_text(name, len(names)), [values[each] for each in names]))
                continue
            # Each value in parentheses: a negative number's literal followed by the compiled cast
            # (``-9223372036854775808::BIGINT``) would otherwise cast before negating, out of range.
            texts.append((_PLACEHOLDER.sub(r"(\g<0>)", sql), values))
        return texts

    def prepare_carried(self) -> None:
        """PostgreSQL, after the commit: prepare by name the statements the commit carried as text, so the
        next commits carry them as ``EXECUTE`` (:meth:`closing`). Once per statement and connection, in a
        round trip of its own outside any transaction, like every ``PREPARE`` (:meth:`_prepared`)."""
        unprepared, self._unprepared = self._unprepared, []
        for sql in dict.fromkeys(unprepared):
            self._prepared(sql)

    def _known_prepared(self) -> dict[str, tuple[str, tuple[str, ...]] | None] | None:
        """PostgreSQL: what :meth:`_prepared` has decided on this connection, by SQL text (``None``: the
        connection keeps no session state for the plane)."""
        info = getattr(self._connection, "info", None)
        if not self.functions or not isinstance(info, dict):
            return None
        known: dict[str, tuple[str, tuple[str, ...]] | None] = info.setdefault(PREPARED_KEY, {})
        return known

    def _prepared(self, sql: str) -> tuple[str, tuple[str, ...]] | None:
        """PostgreSQL: the name ``sql`` is prepared under on this connection (``PREPARE``, run once, in a round
        trip of its own, outside any transaction) and its parameters' names in the order of ``$1``, ``$2``, ...;
        ``None`` where the connection keeps no session state for the plane (no session functions) or the
        server cannot prepare the statement alone (a parameter whose type only the driver's value says)."""
        known = self._known_prepared()
        if known is None:
            return None
        if sql in known:
            return known[sql]
        info: dict[str, Any] = self._connection.info  # a dict: checked by _known_prepared
        generation = info.get(_GENERATION_KEY, 0)
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        name = f"admission_plane_{generation}_{len(known)}"
        raw: Any = getattr(self._connection, "dbapi_connection", self._connection)
        try:
            raw.execute(f"PREPARE {name} AS {_PLACEHOLDER.sub(number, sql).replace('%%', '%')}", prepare=False)
        except raw.ProgrammingError as error:  # the statement, not the connection: plain statements then
            _LOG.debug("statement not prepared by name (%s); it runs after the opening", type(error).__name__)
            known[sql] = None
        else:
            known[sql] = (name, tuple(names))
        return known[sql]

    @staticmethod
    def forget_prepared(info: Any) -> None:
        """Forget the statements prepared by name on a connection whose transaction was rolled back:
        psycopg then deallocates every prepared statement of the session (``DEALLOCATE ALL``), ours too.
        The next ones get names of a new generation, so a statement that survived cannot collide."""
        if isinstance(info, dict) and info.get(PREPARED_KEY):
            info[PREPARED_KEY] = {}
            info[_GENERATION_KEY] = info.get(_GENERATION_KEY, 0) + 1

    def _literals(self, statements: list[tuple[str, Any]]) -> list[str]:
        """PostgreSQL: each ``(sql, values)`` as one text with its values as literals, quoted by the driver.

        Positional values (``%s``) that are all :func:`plain_literal` (or ``bytes``, on a connection with
        ``standard_conforming_strings`` on: :func:`plain_literals`) are written here, as the driver would write
        them (a statement prepared by name is carried as ``EXECUTE`` of such a list: most of what a commit
        carries); the rest are quoted by the driver (``ClientCursor.mogrify``)."""
        raw: Any = getattr(self._connection, "dbapi_connection", self._connection)
        bytea = raw.pgconn.parameter_status(b"standard_conforming_strings") == b"on"
        texts: list[str | None] = []
        for sql, values in statements:
            literals = plain_literals(values, bytea=bytea) if isinstance(values, list) else None
            texts.append(None if literals is None else sql % tuple(literals))
        if None not in texts:
            return texts  # type: ignore[return-value]
        from psycopg import ClientCursor  # only PostgreSQL units hold statements back

        with ClientCursor(raw) as cursor:
            return [
                cursor.mogrify(sql, values or {}) if text is None else text
                for text, (sql, values) in zip(texts, statements, strict=True)
            ]

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
        """Close the cursor, unless it is the one kept with a pooled PostgreSQL connection (the connection stays
        with its unit of work)."""
        if self._kept_cursor is None:
            self._cursor.close()
