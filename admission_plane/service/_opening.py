"""Opening a plane's database: refuse what cannot be one before touching it, then check its schema.

A missing SQLite file is refused, not created (only a migration creates a database); a
directory, a file in a missing directory, a file that is not a database or is corrupt, and a
server that refuses the connection are each one :class:`~admission_plane.errors.AdmissionDatabaseError`
line. Nothing is created next to a database until it has passed the schema check (the
caller opens the doorbell, and with it the ``-writer.lock`` file, only then).
"""

from __future__ import annotations

import os

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from ..store.engine import create_admission_engine, parse_url
from ..store.failures import check_sqlite_path, connect, translated
from ..store.schema_check import check_schema


def open_engine(database: str | os.PathLike[str] | URL | Engine, *, migrate: bool) -> tuple[Engine, bool]:
    """The plane's engine on ``database`` and whether the plane owns it (created it here).

    An SQLite file must exist unless ``migrate`` (the migration creates it).
    """
    url = database.url if isinstance(database, Engine) else parse_url(database)
    check_sqlite_path(url, must_exist=not migrate)
    if isinstance(database, Engine):
        return database, False
    return create_admission_engine(url), True


def open_schema(engine: Engine, *, migrate: bool, allow_foreign_tables: bool) -> None:
    """Migrate to head when asked, then run the fail-closed schema check on ``engine``'s database."""
    if migrate:
        from ..migrate import upgrade

        upgrade(engine, allow_foreign_tables=allow_foreign_tables)
    with connect(engine) as connection, translated(engine.url, engine.dialect):
        check_schema(connection, allow_foreign_tables=allow_foreign_tables)
