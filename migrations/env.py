"""Alembic environment of the admission plane (see :mod:`admission_plane.migrate`).

Every migration step runs in its own transaction, on SQLite too: Alembic's SQLite
implementation declares non-transactional DDL, so ``transactional_ddl=True`` is forced
and the engine from :func:`admission_plane.db.create_admission_engine` opens each
transaction with ``BEGIN IMMEDIATE``. Guards and adoption run first, in the transaction
the first step reuses, so a refusal or a failed step leaves the database unchanged.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from admission_plane.db import create_admission_engine
from admission_plane.errors import AdmissionMigrationError
from admission_plane.migrate import STEP_ROLLED_BACK, prepare_migration, resolve_url
from admission_plane.model import metadata

config = context.config
if config.config_file_name is not None and config.get_section("loggers") is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def run_on(connection: Connection) -> None:
    """Configure the context on ``connection``, run the guards, then the migration steps."""
    external = connection.in_transaction()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        transactional_ddl=True,
        transaction_per_migration=True,
        compare_type=True,
    )
    try:
        # Only commands that move the version (upgrade, downgrade, stamp) adopt or refuse.
        if context.get_revision_argument() is not None:
            prepare_migration(context.get_context(), context.script)
        with context.begin_transaction():
            context.run_migrations()
    except SQLAlchemyError as error:
        if not external and connection.in_transaction():
            connection.rollback()
        raise AdmissionMigrationError(STEP_ROLLED_BACK) from error
    except BaseException:
        if not external and connection.in_transaction():
            connection.rollback()
        raise
    # An adoption stamp with no step after it (a v3 seed database) is still open here.
    if not external and connection.in_transaction():
        connection.commit()


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
