"""Fail-closed integrity check of a live database against the expected schema.

The expected schema is data (:mod:`admission_plane.store.schema_spec`), compared with what
the database reports about itself: ``PRAGMA table_info``/``index_list``/``index_xinfo``/
``foreign_key_list`` and ``sqlite_master`` on SQLite, ``information_schema`` and
``pg_catalog`` on PostgreSQL. Anything that differs, missing or extra, raises
:class:`~admission_plane.errors.SchemaIntegrityError` naming it; nothing is repaired.
Besides the admission tables only Alembic's ``alembic_version`` (holding the head
revision) and SQLite's own ``sqlite_%`` tables may exist, unless the database is shared
with another application (``allow_foreign_tables=True``, as the migration was told): then
its tables and views, and their indexes, constraints and triggers, are left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..errors import SchemaIntegrityError
from .engine import SQLITE_BEGIN_OPTION, deferred
from .model import ADMISSION_TABLES
from .schema_spec import (
    CHECKS,
    EXPECTED_REVISION,
    FOREIGN_KEYS,
    LEDGER,
    SEED_REVISION,
    UNIQUE_CONSTRAINTS,
    VERSION_TABLE,
    Index,
    Spec,
    expected_schema_version,
    expected_spec,
    foreign_tables,
)

__all__ = ["check_schema", "expected_schema_version", "schema_version"]

Query = Callable[..., list[tuple[Any, ...]]]


def schema_version(target: Engine | Connection) -> int:
    """The database's ledger version: 0 without a ``schema_migrations`` table, else ``MAX(version)``."""
    with _reader(target) as (query, dialect):
        if "schema_migrations" not in _table_names(query, dialect):
            return 0
        return int(query("SELECT MAX(version) FROM schema_migrations")[0][0] or 0)


def check_schema(
    target: Engine | Connection, *, revision: str = EXPECTED_REVISION, allow_foreign_tables: bool = False
) -> None:
    """Raise :class:`SchemaIntegrityError` unless the database is exactly the schema of ``revision``.

    The default is the head revision the service layer needs. With
    ``revision=SEED_REVISION`` a database written by the original connector (no
    ``alembic_version`` table) passes too. With ``allow_foreign_tables`` other
    applications' tables and views (and what belongs to them) are ignored. Reads only; a
    connection passed in keeps its transaction state (a transaction this function had to
    open is rolled back).
    """
    spec = expected_spec(revision)
    owned = _owned if allow_foreign_tables else _everything
    with _reader(target) as (query, dialect):
        if dialect == "sqlite":
            _check_sqlite(query, spec, owned)
        elif dialect == "postgresql":
            _check_postgresql(query, spec, owned)
        else:
            raise SchemaIntegrityError(f"database dialect {dialect} is not supported")


@contextmanager
def _reader(target: Engine | Connection) -> Iterator[tuple[Query, str]]:
    """Run the check's queries in one read-only snapshot; a transaction begun here is rolled back."""
    if isinstance(target, Engine):
        with target.connect() as connection, _reader(connection) as reader:
            yield reader
        return
    began = not target.in_transaction()
    begin_mode = target.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
    if began:
        deferred(target)  # one consistent snapshot without SQLite's write lock
    try:
        yield (
            (lambda sql, *params: [tuple(row) for row in target.exec_driver_sql(sql, tuple(params))]),
            (target.dialect.name),
        )
    finally:
        if began:
            if target.in_transaction():
                target.rollback()
            target.execution_options(**{SQLITE_BEGIN_OPTION: begin_mode})


def _table_names(query: Query, dialect: str) -> set[str]:
    if dialect == "sqlite":
        return {name for (name,) in query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {
        name
        for (name,) in query("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
    }


def _owned(table: str) -> bool:
    """Whether ``table`` is one the plane owns (or SQLite's own), not another application's."""
    return not foreign_tables([table])


def _everything(_table: str) -> bool:
    return True


Owned = Callable[[str], bool]


def _compare_names(kind: str, actual: set[str], expected: set[str]) -> None:
    for name in sorted(actual - expected):
        raise SchemaIntegrityError(f"unexpected {kind} {name} is present")
    for name in sorted(expected - actual):
        raise SchemaIntegrityError(f"{kind} {name} is missing")


ColumnsOf = Callable[[str], tuple[tuple[Any, ...], ...]]


def _check_ledger_and_tables(
    query: Query, spec: Spec, tables: set[str], actual: ColumnsOf, expected: ColumnsOf
) -> None:
    """The checks both dialects share: ledger, table set, Alembic's version, and every table's columns."""
    if "schema_migrations" not in tables:
        if tables.intersection(ADMISSION_TABLES):
            raise SchemaIntegrityError("unversioned admission tables are present (no schema_migrations ledger)")
        raise SchemaIntegrityError("the schema_migrations ledger is missing")
    if actual("schema_migrations") != expected("schema_migrations"):
        raise SchemaIntegrityError("table schema_migrations columns do not match the schema contract")
    rows = [(int(version), name) for version, name in query("SELECT version, name FROM schema_migrations")]
    newest = max((version for version, _ in rows), default=0)
    if newest > expected_schema_version():
        raise SchemaIntegrityError(f"schema version {newest} is newer than this connector supports")
    if sorted(rows) != list(LEDGER):
        raise SchemaIntegrityError("schema_migrations ledger rows do not match the schema contract")
    # The revision before the tables: a database at an older revision lacks the newer tables, and
    # "not at revision X" is what its operator needs to hear (upgrade it), not which table is missing.
    seed_written = spec.revision == SEED_REVISION and VERSION_TABLE not in tables
    if not seed_written and (
        VERSION_TABLE not in tables or query(f"SELECT version_num FROM {VERSION_TABLE}") != [(spec.revision,)]
    ):
        raise SchemaIntegrityError(f"{VERSION_TABLE} does not hold revision {spec.revision}")
    present = {name for name in tables if not name.startswith("sqlite_") and name != VERSION_TABLE}
    _compare_names("table", present, set(spec.tables))
    for table in spec.tables:
        if actual(table) != expected(table):
            raise SchemaIntegrityError(f"table {table} columns do not match the schema contract")


def _index_columns(index: Index) -> tuple[tuple[str, bool], ...]:
    return tuple((part.split()[0], part.endswith(" DESC")) for part in index.columns)


def _normalized(sql: str) -> str:
    return " ".join(sql.split())


# --- SQLite -----------------------------------------------------------------------------


def _check_sqlite(query: Query, spec: Spec, owned: Owned) -> None:
    if query("PRAGMA foreign_keys") != [(1,)]:
        raise SchemaIntegrityError("PRAGMA foreign_keys=ON is required")
    # A view's tbl_name is its own name; an index's or trigger's is its table's.
    master = [row for row in query("SELECT type, name, tbl_name, sql FROM sqlite_master") if owned(row[2])]
    for kind in ("view", "trigger"):
        _compare_names(kind, {name for type_, name, _, _ in master if type_ == kind}, set())

    def actual(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple(
            (name, type_, bool(notnull), pk, default)
            for _, name, type_, notnull, default, pk in query(f'PRAGMA table_info("{table}")')
        )

    def expected(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple((c.name, c.type, c.notnull, c.pk, c.default) for c in spec.tables[table])

    table_names = {name for type_, name, _, _ in master if type_ == "table"}
    _check_ledger_and_tables(query, spec, table_names, actual, expected)
    table_sql = {name: _normalized(sql or "") for type_, name, _, sql in master if type_ == "table"}
    for table in spec.tables:
        fragments = [check.sqlite_fragment for check in CHECKS if check.table == table]
        expected_checks = sum(fragment.count("CHECK") for fragment in fragments)
        if (
            any(_normalized(fragment) not in table_sql[table] for fragment in fragments)
            or len(re.findall(r"\bCHECK\b", table_sql[table], re.IGNORECASE)) != expected_checks
        ):
            raise SchemaIntegrityError(f"table {table} CHECK constraints do not match the schema contract")
        foreign_keys = {
            (target, column, target_column, on_update, on_delete)
            for _id, _seq, target, column, target_column, on_update, on_delete, _match in query(
                f'PRAGMA foreign_key_list("{table}")'
            )
        }
        expected_keys = {
            (fk.target, fk.columns[0], fk.target_columns[0], "NO ACTION", fk.on_delete)
            for fk in FOREIGN_KEYS
            if fk.table == table
        }
        if foreign_keys != expected_keys:
            raise SchemaIntegrityError(f"table {table} foreign keys do not match the schema contract")

    named = {name: (table, sql) for type_, name, table, sql in master if type_ == "index" and sql is not None}
    _compare_names("index", set(named), {index.name for index in spec.indexes})
    for index in spec.indexes:
        listed = {
            name: (bool(unique), bool(partial))
            for _seq, name, unique, _origin, partial in query(f'PRAGMA index_list("{index.table}")')
        }
        keys = tuple(
            (name, bool(desc), collation)
            for _, _, name, desc, collation, key in query(f'PRAGMA index_xinfo("{index.name}")')
            if key
        )
        expected_keys_ = tuple((name, desc, "BINARY") for name, desc in _index_columns(index))
        where_ok = index.where is None or f"WHERE {index.where}" in _normalized(named[index.name][1])
        if listed.get(index.name) != (index.unique, index.where is not None) or keys != expected_keys_ or not where_ok:
            raise SchemaIntegrityError(f"index {index.name} does not match the schema contract")

    unique: set[tuple[str, tuple[str, ...]]] = set()
    for table in spec.tables:
        for _, name, _unique, origin, _ in query(f'PRAGMA index_list("{table}")'):
            if origin == "u":
                unique.add((table, tuple(row[2] for row in query(f'PRAGMA index_info("{name}")'))))
    if unique != set(UNIQUE_CONSTRAINTS):
        raise SchemaIntegrityError("unique constraints do not match the schema contract")


# --- PostgreSQL -------------------------------------------------------------------------

_PG_TYPES = {"INTEGER": "bigint", "TEXT": "text", "BLOB": "bytea"}


def _check_postgresql(query: Query, spec: Spec, owned: Owned) -> None:
    def actual(table: str) -> tuple[tuple[Any, ...], ...]:
        keys = query(
            "SELECT a.attname FROM pg_constraint c JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n) "
            "ON TRUE JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
            "WHERE c.contype = 'p' AND c.conrelid = to_regclass(quote_ident(%s)) ORDER BY k.n",
            table,
        )
        positions = {name: position for position, (name,) in enumerate(keys, start=1)}
        rows = query(
            "SELECT column_name, data_type, is_nullable, column_default, is_identity FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            table,
        )
        return tuple(
            (name, type_, nullable == "NO", positions.get(name, 0), default, identity == "YES")
            for name, type_, nullable, default, identity in rows
        )

    def expected(table: str) -> tuple[tuple[Any, ...], ...]:
        return tuple(
            (c.name, _PG_TYPES[c.type], c.notnull or c.pk > 0, c.pk, c.pg_default or c.default, c.identity)
            for c in spec.tables[table]
        )

    tables = {name for name in _table_names(query, "postgresql") if owned(name)}
    _check_ledger_and_tables(query, spec, tables, actual, expected)

    constraints = query(
        "SELECT c.conrelid::regclass::text, c.contype, c.conname, pg_get_constraintdef(c.oid), c.confdeltype, "
        "c.confrelid::regclass::text, "
        "ARRAY(SELECT attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i) JOIN pg_attribute a "
        "      ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i), "
        "ARRAY(SELECT attname FROM unnest(c.confkey) WITH ORDINALITY k(n, i) JOIN pg_attribute a "
        "      ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i) "
        "FROM pg_constraint c WHERE c.connamespace = current_schema()::regnamespace AND c.contype IN ('c', 'f', 'u')"
    )
    constraints = [row for row in constraints if owned(row[0])]
    checks = {(table, name, definition) for table, kind, name, definition, *_ in constraints if kind == "c"}
    if checks != {(c.table, c.pg_name, c.pg_definition) for c in CHECKS if c.pg_name is not None}:
        raise SchemaIntegrityError("CHECK constraints do not match the schema contract")
    actions = {"a": "NO ACTION", "c": "CASCADE", "r": "RESTRICT", "n": "SET NULL", "d": "SET DEFAULT"}
    foreign_keys = {
        (table, tuple(columns), target, tuple(target_columns), actions.get(delete, delete))
        for table, kind, _, _, delete, target, columns, target_columns in constraints
        if kind == "f"
    }
    if foreign_keys != {(fk.table, fk.columns, fk.target, fk.target_columns, fk.on_delete) for fk in FOREIGN_KEYS}:
        raise SchemaIntegrityError("foreign keys do not match the schema contract")
    unique = {(table, tuple(columns)) for table, kind, _, _, _, _, columns, _ in constraints if kind == "u"}
    if unique != set(UNIQUE_CONSTRAINTS):
        raise SchemaIntegrityError("unique constraints do not match the schema contract")
    triggers = query(
        "SELECT r.relname FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid "
        "WHERE NOT t.tgisinternal AND r.relnamespace = current_schema()::regnamespace"
    )
    if any(owned(table) for (table,) in triggers):
        raise SchemaIntegrityError("unexpected trigger is present")

    indexes = query(
        "SELECT r.relname, t.relname, i.indisunique, pg_get_expr(i.indpred, i.indrelid), "
        "ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true) FROM generate_series(1, i.indnkeyatts) k ORDER BY k), "
        "ARRAY(SELECT (i.indoption[k - 1] & 1) = 1 FROM generate_series(1, i.indnkeyatts) k ORDER BY k) "
        "FROM pg_index i JOIN pg_class r ON r.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "WHERE t.relnamespace = current_schema()::regnamespace AND t.relname <> %s "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
        VERSION_TABLE,
    )
    actual_indexes = {
        name: (table, unique_, where, tuple(zip(columns, descending, strict=True)))
        for name, table, unique_, where, columns, descending in indexes
        if owned(table)
    }
    _compare_names("index", set(actual_indexes), {index.name for index in spec.indexes})
    for index in spec.indexes:
        where = index.pg_where or (None if index.where is None else f"({index.where})")
        if actual_indexes[index.name] != (index.table, index.unique, where, _index_columns(index)):
            raise SchemaIntegrityError(f"index {index.name} does not match the schema contract")
