"""Alembic environment of the admission plane (see :mod:`admission_plane.migrate`).

Every migration step runs in its own transaction, on SQLite too: Alembic's SQLite
implementation declares non-transactional DDL, so ``transactional_ddl=True`` is forced
and the engine from :func:`admission_plane.db.create_admission_engine` opens each
transaction with ``BEGIN IMMEDIATE``. Guards and adoption run first, in the transaction
the first step reuses, so a refusal or a failed step leaves the database unchanged. A
database holding other applications' tables is refused unless ``allow_foreign_tables``
is given (``-x allow_foreign_tables=true`` from the ``alembic`` command line), and one
migration at a time runs per database (:mod:`admission_plane.store.migration_lock`).
"""

from __future__ import annotations

import contextlib
from logging.config import fileConfig
from typing import Any

from alembic import context
from alembic.operations import ops
from sqlalchemy import ForeignKeyConstraint
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from admission_plane.errors import AdmissionMigrationError
from admission_plane.migrate import STEP_ROLLED_BACK, prepare_migration, resolve_url
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.migration_lock import HELD, migration_lock
from admission_plane.store.model import metadata
from admission_plane.store.schema_spec import foreign_tables
from admission_plane.store.unit_of_work import contention_name

config = context.config
if config.config_file_name is not None and config.get_section("loggers") is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def drop_sqlite_reflection_artefacts(migration_context: Any, _revision: Any, directives: list[Any]) -> None:
    """Remove the two false differences SQLite reflection reports for the seed's DDL, each verified by PRAGMA.

    The seed declares ``x TEXT PRIMARY KEY`` without NOT NULL (SQLite then reflects the key
    as nullable; the entities cannot say that portably), and writes foreign keys inline as
    ``REFERENCES t(c) ON DELETE CASCADE``, whose action SQLAlchemy does not reflect (it parses
    only table-level FOREIGN KEY clauses). Everything else autogenerate finds is kept.
    """
    connection = migration_context.connection
    if connection is None or connection.dialect.name != "sqlite" or not directives:
        return
    for upgrade_ops in directives[0].upgrade_ops_list:
        for table_ops in upgrade_ops.ops:
            if isinstance(table_ops, ops.ModifyTableOps):
                table_ops.ops = _without_artefacts(connection, table_ops.table_name, table_ops.ops)
        upgrade_ops.ops = [op for op in upgrade_ops.ops if not (isinstance(op, ops.ModifyTableOps) and not op.ops)]


def _without_artefacts(connection: Connection, table: str, table_ops: list[Any]) -> list[Any]:
    info = {row[1]: row for row in connection.exec_driver_sql(f'PRAGMA table_info("{table}")')}
    pragma_fks: dict[tuple[tuple[Any, ...], Any, tuple[Any, ...]], Any] = {
        ((row[3],), row[2], (row[4],)): row[6]
        for row in connection.exec_driver_sql(f'PRAGMA foreign_key_list("{table}")')
    }
    cascades = {
        (tuple(op.local_cols), op.referent_table, tuple(op.remote_cols))
        for op in table_ops
        if isinstance(op, ops.CreateForeignKeyOp)
        and pragma_fks.get((tuple(op.local_cols), op.referent_table, tuple(op.remote_cols)))
        == str(op.kw.get("ondelete") or "NO ACTION").upper()
    }

    def artefact(op: Any) -> bool:
        if isinstance(op, ops.AlterColumnOp):
            row = info.get(op.column_name)
            only_nullable = (
                op.modify_nullable is False
                and op.existing_nullable is True
                and not any((op.modify_type, op.modify_server_default, op.modify_name, op.modify_comment))
            )
            return only_nullable and row is not None and row[5] > 0 and row[3] == 0
        if isinstance(op, ops.CreateForeignKeyOp):
            return (tuple(op.local_cols), op.referent_table, tuple(op.remote_cols)) in cascades
        if isinstance(op, ops.DropConstraintOp) and op.constraint_type == "foreignkey":
            fk = op.to_constraint()
            assert isinstance(fk, ForeignKeyConstraint)  # constraint_type says so
            element = next(iter(fk.elements))
            signature = (tuple(fk.column_keys), element.column.table.name, tuple(e.column.name for e in fk.elements))
            return signature in cascades
        return False

    return [op for op in table_ops if not artefact(op)]


def allow_foreign_tables() -> bool:
    """Whether the database may hold other applications' tables: ``allow_foreign_tables`` passed by
    :mod:`admission_plane.migrate`, else ``-x allow_foreign_tables=true``; by default it may not."""
    given = config.attributes.get("allow_foreign_tables")
    if given is None:
        given = context.get_x_argument(as_dictionary=True).get("allow_foreign_tables", "")
    return given is True or str(given).lower() in {"1", "true", "yes"}


def include_owned_tables(name: str | None, type_: str, _parent_names: Any) -> bool:
    """Autogenerate (``alembic check``) of a shared database compares only the tables the plane owns."""
    return type_ != "table" or name is None or not foreign_tables([name])


def run_on(connection: Connection) -> None:
    """Configure the context on ``connection``, run the guards, then the migration steps.

    Commands that move the version (upgrade, downgrade, stamp) hold the migration lock from
    the guards to the last step, so concurrent runs follow one another (the later ones find
    the database at head), and adopt or refuse the database first.
    """
    external = connection.in_transaction()
    sharing = allow_foreign_tables()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        transactional_ddl=True,
        transaction_per_migration=True,
        compare_type=True,
        process_revision_directives=drop_sqlite_reflection_artefacts,
        include_name=include_owned_tables if sharing else None,
    )
    try:
        migration_context = context.get_context()
        moves = migration_context.opts.get("destination_rev") is not None
        locking = moves and not config.attributes.get(HELD)  # held: the caller took it before connecting
        with migration_lock(connection) if locking else contextlib.nullcontext():
            if moves:
                prepare_migration(migration_context, context.script, allow_foreign_tables=sharing)
            with context.begin_transaction():
                context.run_migrations()
            # An adoption stamp with no step after it (a v3 seed database) is still open here.
            if not external and connection.in_transaction():
                connection.commit()
    except SQLAlchemyError as error:
        if not external and connection.in_transaction():
            connection.rollback()
        busy = contention_name(error)
        if busy is not None:
            raise AdmissionMigrationError(
                f"the database stayed locked by another writer ({busy}); the step was rolled back, run it again"
            ) from error
        raise AdmissionMigrationError(STEP_ROLLED_BACK) from error
    except BaseException:
        if not external and connection.in_transaction():
            connection.rollback()
        raise


def run_migrations_online() -> None:
    """Run against the passed connection, or an engine built from the resolved URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    url = resolve_url(config, context.get_x_argument(as_dictionary=True))
    engine = create_admission_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise AdmissionMigrationError("offline (--sql) mode is not supported: adoption and guards need a live database")
run_migrations_online()
