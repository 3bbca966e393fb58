"""Alembic entry points, the guards every migration passes, and adoption of seed databases.

The Alembic history in ``migrations/`` reproduces the seed's schema history (v1, v2, v3)
revision for revision. A database written by the original connector carries the seed's
``schema_migrations`` ledger but no ``alembic_version`` table: before any revision runs,
:func:`prepare_migration` recognises its ledger version and stamps the matching revision
inside the transaction of the first migration step, so adoption and the step that follows
commit or roll back together. It refuses, changing nothing, a ledger newer than this code,
admission tables without any version record, an ``alembic_version`` that disagrees with
the ledger, (on SQLite) an engine too old for ``ALTER TABLE RENAME COLUMN``, and a database
holding tables it does not own unless ``allow_foreign_tables=True``. One migration runs at a
time per database (:mod:`admission_plane.store.migration_lock`). A database that cannot be
reached or read raises a one-line :class:`~admission_plane.errors.AdmissionDatabaseError`.

The service layer calls :func:`upgrade` with its engine; operators run ``alembic upgrade
head`` from the project root (``-x url=...``, else ``ADMISSION_PLANE_DATABASE_URL``, else
``sqlalchemy.url`` in ``alembic.ini``; a plain path means an SQLite file).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from . import _validate as v
from .clock import wall_clock_ms
from .errors import AdmissionMigrationError
from .store.engine import (
    DATABASE_URL_VARIABLE,
    DEFAULT_BUSY_TIMEOUT_MS,
    create_admission_engine,
    deferred,
    parse_url,
    writer_lock_path,
)
from .store.failures import check_sqlite_path, connect, database_error, translated
from .store.migration_lock import HELD, sqlite_gate
from .store.model import ADMISSION_TABLES
from .store.schema_spec import EXPECTED_REVISION, LEDGER, foreign_tables

__all__ = [
    "HEAD_REVISION",
    "LEDGER_TABLE",
    "SEED_LEDGER",
    "SEED_REVISIONS",
    "URL_ENVIRONMENT_VARIABLE",
    "alembic_config",
    "assert_drop_column_available",
    "assert_rename_column_available",
    "current_revision",
    "downgrade",
    "migrations_directory",
    "parse_sqlite_version",
    "prepare_migration",
    "read_sqlite_version",
    "upgrade",
]

#: The newest revision of the history shipped with this package (the one the service layer requires).
HEAD_REVISION = EXPECTED_REVISION
#: The seed's ledger: ``(version, name)`` of every schema version it knows.
SEED_LEDGER: tuple[tuple[int, str], ...] = LEDGER
#: The Alembic revision that writes each ledger version.
SEED_REVISIONS: Mapping[int, str] = {1: "0001_seed_v1", 2: "0002_seed_v2", 3: "0003_seed_v3"}
LEDGER_TABLE = "schema_migrations"
URL_ENVIRONMENT_VARIABLE = DATABASE_URL_VARIABLE
MIN_SQLITE_VERSION = (3, 25, 0)
MIN_SQLITE_DROP_COLUMN_VERSION = (3, 35, 0)
#: The seed's wording for any failure inside a migration step (also used for v3 steps).
STEP_ROLLED_BACK = "v2 DDL transaction rolled back"
_SQLITE_TABLES_AND_VIEWS = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"

DatabaseTarget = str | os.PathLike[str] | URL | Engine | Connection


def migrations_directory() -> Path:
    """The Alembic script directory: inside the package when shipped there, else the repository's."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise AdmissionMigrationError("the migrations directory could not be found")


def alembic_config(url: str | os.PathLike[str] | URL | None = None, connection: Connection | None = None) -> Config:
    """An Alembic :class:`~alembic.config.Config` for this package's history, usable from any directory.

    ``connection`` (used as is, inside or outside a transaction) wins over ``url``; with
    neither, ``env.py`` falls back to ``ADMISSION_PLANE_DATABASE_URL``.
    """
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.attributes["url"] = url
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(target: DatabaseTarget, revision: str = "head", *, allow_foreign_tables: bool = False) -> None:
    """Upgrade (or adopt and upgrade) the database to ``revision``; each step is one transaction.

    A database holding tables the plane does not own (another application's) is refused
    before anything is written, unless ``allow_foreign_tables`` lets the plane share it.
    One migration runs at a time per database; a concurrent one waits for it (see
    :mod:`admission_plane.store.migration_lock`). A missing SQLite file is created.
    A ``revision`` that is not an identifier raises :class:`~admission_plane.errors.InvalidInputError`,
    one Alembic cannot reach :class:`AdmissionMigrationError`; neither changes anything.
    """
    v.identifier(revision, "migration target revision")
    with _connection_for(target, must_exist=False, allow_foreign_tables=allow_foreign_tables, gate=True) as connection:
        _run(
            command.upgrade,
            _migration_config(connection, allow_foreign_tables, gated=not isinstance(target, Connection)),
            revision,
        )


def downgrade(target: DatabaseTarget, revision: str, *, allow_foreign_tables: bool = False) -> None:
    """Downgrade the database to ``revision`` (``"base"`` drops every admission table).

    Refuses, as :func:`upgrade` does, a database holding foreign tables unless ``allow_foreign_tables``,
    and a ``revision`` it cannot take.
    """
    v.identifier(revision, "migration target revision")
    with _connection_for(target, allow_foreign_tables=allow_foreign_tables, gate=True) as connection:
        _run(
            command.downgrade,
            _migration_config(connection, allow_foreign_tables, gated=not isinstance(target, Connection)),
            revision,
        )


def _run(step: Callable[[Config, str], None], config: Config, revision: str) -> None:
    """Run an Alembic command; a revision it cannot resolve or reach is an :class:`AdmissionMigrationError`.

    Alembic resolves the revision before any step runs, inside the migration's transaction,
    which then rolls back; it asserts on some malformed ones (``@``, ``head+1``).
    """
    try:
        step(config, revision)
    except (CommandError, RevisionError, AssertionError) as error:
        detail = " ".join(str(error).split()) or f"revision {revision!r} cannot be resolved"
        raise AdmissionMigrationError(detail) from error


def _migration_config(connection: Connection, allow_foreign_tables: bool, *, gated: bool = False) -> Config:
    config = alembic_config(connection=connection)
    config.attributes["allow_foreign_tables"] = allow_foreign_tables
    # SQLite: :func:`_connection_for` took the migration lock before connecting (env.py must not take it again).
    config.attributes[HELD] = gated and connection.dialect.name == "sqlite"
    return config


def current_revision(target: DatabaseTarget) -> str | None:
    """The revision recorded in ``alembic_version``, or ``None`` (fresh, or a seed database not yet adopted).

    A missing SQLite file (in an existing directory) is fresh: ``None``, and it is not created.
    """
    if not isinstance(target, Connection):
        url = target.url if isinstance(target, Engine) else parse_url(target)
        check_sqlite_path(url, must_exist=False)
        if url.get_backend_name() == "sqlite" and url.database and not os.path.lexists(url.database):
            return None
    with _connection_for(target, read_only=True) as connection:
        revision = MigrationContext.configure(connection).get_current_revision()
        if connection.in_transaction():
            connection.rollback()
        return revision


@contextmanager
def _connection_for(
    target: DatabaseTarget,
    *,
    read_only: bool = False,
    must_exist: bool = True,
    allow_foreign_tables: bool = True,
    gate: bool = False,
) -> Iterator[Connection]:
    """A connection on ``target``; every failure to reach or read the database said in one line.

    A missing SQLite file is refused (``must_exist``) before a connection could create it,
    and a file holding foreign tables (unless allowed) before the engine's connection
    switches it to WAL: a refused database is left byte for byte as it was.
    """
    if isinstance(target, Connection):
        yield target
        return
    url = target.url if isinstance(target, Engine) else parse_url(target)
    check_sqlite_path(url, must_exist=must_exist)
    if not allow_foreign_tables:
        _refuse_foreign_sqlite_tables(url)
    engine = target if isinstance(target, Engine) else create_admission_engine(url, poolclass=NullPool)
    # ``gate``: a migration of an SQLite file takes its lock before it connects (migration_lock.sqlite_gate).
    held = sqlite_gate(writer_lock_path(engine), str(url.database)) if gate else contextlib.nullcontext()
    try:
        with held, connect(engine) as connection, translated(url, engine.dialect):
            yield deferred(connection) if read_only else connection
    finally:
        if engine is not target:
            engine.dispose()


def _refuse_foreign_sqlite_tables(url: URL) -> None:
    """Read an existing SQLite file's table names with a plain driver connection (no pragma, no write)."""
    if url.get_backend_name() != "sqlite" or not url.database or not os.path.isfile(url.database):
        return
    uri = f"file:{quote(os.path.abspath(url.database))}?mode=rw"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=DEFAULT_BUSY_TIMEOUT_MS / 1000)) as connection:
            names = [name for (name,) in connection.execute(_SQLITE_TABLES_AND_VIEWS)]
    except sqlite3.Error as error:
        raise database_error(url, error) from error
    _refuse_foreign(names)


def _refuse_foreign(names: Iterable[str]) -> None:
    foreign = foreign_tables(names)
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise AdmissionMigrationError(
            f"the database holds tables it does not own: {listed}; give the admission plane a database of its "
            "own, or allow sharing with allow_foreign_tables=True (--allow-foreign-tables on the command line)"
        )


def resolve_url(config: Config, x_arguments: Mapping[str, str]) -> str | URL:
    """The database ``env.py`` opens: ``-x url=``, ``ADMISSION_PLANE_DATABASE_URL``, then ``sqlalchemy.url``."""
    for candidate in (
        config.attributes.get("url"),
        x_arguments.get("url"),
        os.environ.get(URL_ENVIRONMENT_VARIABLE),
        config.get_main_option("sqlalchemy.url"),
    ):
        if candidate:
            return candidate if isinstance(candidate, URL) else os.fspath(candidate)
    raise AdmissionMigrationError(
        f"no database given: pass -x url=..., set {URL_ENVIRONMENT_VARIABLE} or sqlalchemy.url in alembic.ini"
    )


# --- SQLite version gate -------------------------------------------------------------------


def read_sqlite_version(connection: Connection) -> str:
    """The SQLite library version the connection runs on (patched by tests to simulate old engines)."""
    return str(connection.exec_driver_sql("SELECT sqlite_version()").scalar_one())


def parse_sqlite_version(version: str) -> tuple[int, int, int]:
    """``"3.40.1"`` -> ``(3, 40, 1)``; a missing patch level reads as 0 (the seed's rule)."""
    parts = version.split(".")
    if len(parts) < 2 or len(parts) > 3 or not all(part.isascii() and part.isdigit() for part in parts):
        raise AdmissionMigrationError(f"SQLite version {version} could not be parsed")
    numbers = [int(part) for part in parts] + [0]
    return numbers[0], numbers[1], numbers[2]


def assert_rename_column_available(version: str) -> None:
    """Refuse an SQLite older than 3.25.0, which cannot run the v2 step's ``RENAME COLUMN``."""
    if parse_sqlite_version(version) < MIN_SQLITE_VERSION:
        raise AdmissionMigrationError(f"SQLite {version} does not support ALTER TABLE RENAME COLUMN")


def assert_drop_column_available(version: str) -> None:
    """Refuse an SQLite older than 3.35.0, which cannot run the v2 downgrade's ``DROP COLUMN``."""
    if parse_sqlite_version(version) < MIN_SQLITE_DROP_COLUMN_VERSION:
        raise AdmissionMigrationError(f"SQLite {version} does not support ALTER TABLE DROP COLUMN")


# --- Guards and adoption (called by env.py before any revision runs) ------------------------


def prepare_migration(
    context: MigrationContext, script: ScriptDirectory, *, allow_foreign_tables: bool = False
) -> None:
    """Check the database may be migrated, and stamp a seed database's ledger version.

    Runs in the transaction that the first migration step will reuse (on SQLite,
    ``BEGIN IMMEDIATE``, so the decision and the step hold the write lock together).
    Raises :class:`AdmissionMigrationError` and changes nothing when the database is
    newer than this code, unversioned, inconsistent, on too old an SQLite, or holds
    tables or views the plane does not own (unless ``allow_foreign_tables``).
    """
    connection = context.connection
    assert connection is not None
    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        assert_rename_column_available(read_sqlite_version(connection))
        _assert_in_explicit_sqlite_transaction(connection)
    inspector = sa.inspect(connection)
    tables = set(inspector.get_table_names())
    if not allow_foreign_tables:
        _refuse_foreign(tables.union(inspector.get_view_names()))
    ledger = _read_ledger(connection) if LEDGER_TABLE in tables else None
    ledger_version = max((version for version, _ in ledger), default=0) if ledger is not None else 0
    if ledger_version > len(SEED_LEDGER):
        raise AdmissionMigrationError(f"schema version {ledger_version} is newer than this connector supports")
    heads = context.get_current_heads()
    if heads:
        _assert_revision_matches_ledger(script, heads, ledger_version)
        return
    if ledger is not None:
        if ledger != list(SEED_LEDGER[:ledger_version]) or ledger_version == 0:
            raise AdmissionMigrationError("schema_migrations ledger does not match any known schema version")
        if not is_sqlite:
            raise AdmissionMigrationError("only SQLite databases of the original connector can be adopted")
        context.stamp(script, SEED_REVISIONS[ledger_version])
        return
    if tables.intersection(ADMISSION_TABLES):
        raise AdmissionMigrationError("unversioned admission tables require an explicit migration before use")


def _assert_in_explicit_sqlite_transaction(connection: Connection) -> None:
    # pysqlite's legacy transaction handling commits before DDL; a migration step would
    # then not roll back as a whole. The engine from create_admission_engine begins explicitly.
    dbapi_connection: Any = connection.connection.dbapi_connection
    if not connection.in_transaction() or not dbapi_connection.in_transaction:
        raise AdmissionMigrationError(
            "the SQLite connection is not inside an explicit transaction (use create_admission_engine)"
        )


def _read_ledger(connection: Connection) -> list[tuple[int, str]]:
    rows = connection.execute(sa.text(f"SELECT version, name FROM {LEDGER_TABLE} ORDER BY version"))
    return [(int(version), str(name)) for version, name in rows]


def _assert_revision_matches_ledger(script: ScriptDirectory, heads: tuple[str, ...], ledger_version: int) -> None:
    if len(heads) != 1:
        raise AdmissionMigrationError(f"alembic_version holds {len(heads)} revisions; expected one")
    try:
        lineage = list(script.iterate_revisions(heads[0], "base"))
    except (CommandError, RevisionError):
        raise AdmissionMigrationError(f"schema revision {heads[0]} is not known to this connector") from None
    expected = max((getattr(revision.module, "seed_ledger_version", 0) for revision in lineage), default=0)
    if expected != ledger_version:
        raise AdmissionMigrationError(
            f"alembic revision {heads[0]} disagrees with schema_migrations version {ledger_version}"
        )


# --- Helpers for revision scripts (keep their behaviour stable: the history depends on them) --


def execute_script(connection: Connection, script: str) -> None:
    """Execute a ``;``-separated DDL script statement by statement, text unchanged.

    SQLite keeps each ``CREATE`` statement's own text in ``sqlite_master``, so executing
    the seed's script literally makes the schema byte-identical to the original's.
    """
    for statement in script.split(";"):
        if statement.strip():
            connection.exec_driver_sql(statement.strip())


def record_ledger(connection: Connection, version: int) -> None:
    """Insert the seed ledger row of ``version`` (applied_at = wall clock, in milliseconds)."""
    name = dict(SEED_LEDGER)[version]
    connection.execute(
        sa.text(f"INSERT INTO {LEDGER_TABLE} (version, name, applied_at) VALUES (:version, :name, :applied_at)"),
        {"version": version, "name": name, "applied_at": wall_clock_ms()},
    )


def erase_ledger(connection: Connection, version: int) -> None:
    """Delete the seed ledger row of ``version`` (a downgrade)."""
    connection.execute(sa.text(f"DELETE FROM {LEDGER_TABLE} WHERE version = :version"), {"version": version})
