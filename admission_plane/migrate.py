"""Alembic entry points, the guards every migration passes, and adoption of seed databases.

The Alembic history in ``migrations/`` reproduces the seed's schema history (v1, v2, v3)
revision for revision. A database written by the original connector carries the seed's
``schema_migrations`` ledger but no ``alembic_version`` table: before any revision runs,
:func:`prepare_migration` recognises its ledger version and stamps the matching revision
inside the transaction of the first migration step, so adoption and the step that follows
commit or roll back together. It refuses, changing nothing, a ledger newer than this code,
admission tables without any version record, an ``alembic_version`` that disagrees with
the ledger, and (on SQLite) an engine too old for ``ALTER TABLE RENAME COLUMN``.

The service layer calls :func:`upgrade` with its engine; operators run ``alembic upgrade
head`` from the project root (``-x url=...``, else ``ADMISSION_PLANE_DATABASE_URL``, else
``sqlalchemy.url`` in ``alembic.ini``; a plain path means an SQLite file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from .clock import wall_clock_ms
from .errors import AdmissionMigrationError
from .store.engine import DATABASE_URL_VARIABLE, create_admission_engine, deferred
from .store.model import ADMISSION_TABLES
from .store.schema_spec import EXPECTED_REVISION, LEDGER

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


def upgrade(target: DatabaseTarget, revision: str = "head") -> None:
    """Upgrade (or adopt and upgrade) the database to ``revision``; each step is one transaction."""
    with _connection_for(target) as connection:
        command.upgrade(alembic_config(connection=connection), revision)


def downgrade(target: DatabaseTarget, revision: str) -> None:
    """Downgrade the database to ``revision`` (``"base"`` drops every admission table)."""
    with _connection_for(target) as connection:
        command.downgrade(alembic_config(connection=connection), revision)


def current_revision(target: DatabaseTarget) -> str | None:
    """The revision recorded in ``alembic_version``, or ``None`` (fresh, or a seed database not yet adopted)."""
    with _connection_for(target, read_only=True) as connection:
        revision = MigrationContext.configure(connection).get_current_revision()
        if connection.in_transaction():
            connection.rollback()
        return revision


@contextmanager
def _connection_for(target: DatabaseTarget, *, read_only: bool = False) -> Iterator[Connection]:
    if isinstance(target, Connection):
        yield target
        return
    engine = target if isinstance(target, Engine) else create_admission_engine(target, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            yield deferred(connection) if read_only else connection
    finally:
        if engine is not target:
            engine.dispose()


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


def prepare_migration(context: MigrationContext, script: ScriptDirectory) -> None:
    """Check the database may be migrated, and stamp a seed database's ledger version.

    Runs in the transaction that the first migration step will reuse (on SQLite,
    ``BEGIN IMMEDIATE``, so the decision and the step hold the write lock together).
    Raises :class:`AdmissionMigrationError` and changes nothing when the database is
    newer than this code, unversioned, inconsistent, or on too old an SQLite.
    """
    connection = context.connection
    assert connection is not None
    is_sqlite = connection.dialect.name == "sqlite"
    if is_sqlite:
        assert_rename_column_available(read_sqlite_version(connection))
        _assert_in_explicit_sqlite_transaction(connection)
    tables = set(sa.inspect(connection).get_table_names())
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
