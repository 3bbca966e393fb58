"""What can go wrong with the database itself, said in one line of ours.

Unusable SQLite paths (a directory, a missing directory, a file that does not exist where
one must), files that are not a database or are corrupt, servers that refuse the connection
and connections lost mid-operation all become
:class:`~admission_plane.errors.AdmissionDatabaseError` with a one-line message: what is
wrong, the database (an SQLite file by its path, a server URL without its password) and the
driver's own words, never its traceback text. The driver's exception stays chained as
``__cause__``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import URL, Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import AdmissionDatabaseError
from .engine import SQLITE_BEGIN_OPTION, deferred, redacted_url

__all__ = [
    "check_sqlite_path",
    "connect",
    "connection_lost",
    "database_error",
    "driver_message",
    "is_corruption",
    "shown",
    "sqlite_integrity_problems",
    "translated",
]

#: How a lost connection is named, first, in the message of the error it causes.
CONNECTION_LOST = "database connection was lost"
#: PostgreSQL SQLSTATEs of a server ending the session: admin shutdown, crash shutdown, cannot connect now.
_SERVER_ENDED = frozenset({"57P01", "57P02", "57P03"})
_CREATE_HINT = "create it with `admission-plane db upgrade` or admission_plane.migrate.upgrade"


def shown(url: URL) -> str:
    """How a database is named in messages: an SQLite file by its path, a server URL without any password."""
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return redacted_url(url)


def driver_message(error: BaseException) -> str:
    """The driver's own message in one line (without SQLAlchemy's statement and background link)."""
    original: BaseException = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    return " ".join(str(original).split()) or type(original).__name__


def _sqlite_error_name(error: BaseException) -> str:
    original = error.orig if isinstance(error, DBAPIError) else error
    name: object = getattr(original, "sqlite_errorname", None)
    return name if isinstance(name, str) else ""


def is_corruption(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the SQLite file is corrupt or not a database."""
    current: BaseException | None = error
    while current is not None:
        name = _sqlite_error_name(current)
        if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB":
            return True
        current = current.__cause__
    return False


def check_sqlite_path(url: URL, *, must_exist: bool) -> None:
    """Refuse an SQLite path that cannot hold a database before any connection creates a file there.

    A directory, or a path in a missing directory, is refused; so is a missing file when
    ``must_exist`` (only a migration creates a database). Other URLs pass unchecked.
    """
    if url.get_backend_name() != "sqlite" or not url.database:
        return
    path = url.database
    if os.path.isdir(path):
        raise AdmissionDatabaseError(f"SQLite database {path} is a directory")
    if os.path.lexists(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AdmissionDatabaseError(f"SQLite database {path} cannot be created: directory {parent} does not exist")
    if must_exist:
        raise AdmissionDatabaseError(f"SQLite database {path} does not exist ({_CREATE_HINT})")


def database_error(url: URL, error: BaseException, *, connecting: bool = False) -> AdmissionDatabaseError:
    """The one-line :class:`AdmissionDatabaseError` for a driver ``error`` on the database ``url``."""
    detail = driver_message(error)
    if url.get_backend_name() != "sqlite":
        return AdmissionDatabaseError(f"{'cannot connect to' if connecting else 'database'} {shown(url)}: {detail}")
    name, path = _sqlite_error_name(error), shown(url)
    if name == "SQLITE_NOTADB":
        return AdmissionDatabaseError(f"{path} is not an SQLite database ({detail})")
    if name.startswith("SQLITE_CORRUPT"):
        return AdmissionDatabaseError(f"SQLite database {path} is corrupt ({detail})")
    if name.startswith("SQLITE_CANTOPEN"):
        return AdmissionDatabaseError(f"cannot open SQLite database {path} ({detail})")
    return AdmissionDatabaseError(f"SQLite database {path}: {detail}")


def _driver_errors(dialect: Dialect) -> tuple[type[BaseException], ...]:
    dbapi: Any = dialect.loaded_dbapi
    return (DBAPIError, dbapi.Error)


@contextmanager
def translated(url: URL, dialect: Dialect) -> Iterator[None]:
    """Inside the block, a driver error on ``url`` becomes a one-line :class:`AdmissionDatabaseError`."""
    try:
        yield
    except _driver_errors(dialect) as error:
        raise database_error(url, error) from error


def connect(engine: Engine) -> Connection:
    """``engine.connect()``, a failure to connect (or to configure the connection) said in one line."""
    try:
        return engine.connect()
    except _driver_errors(engine.dialect) as error:
        raise database_error(engine.url, error, connecting=True) from error


def connection_lost(dialect: Dialect, error: BaseException, dbapi_connection: Any) -> bool:
    """Whether ``error`` means the driver connection ``dbapi_connection`` is gone (the server ended it)."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    original = error.orig if isinstance(error, DBAPIError) else error
    state: object = getattr(original, "sqlstate", None)
    if isinstance(state, str) and (state.startswith("08") or state in _SERVER_ENDED):
        return True
    if dbapi_connection is None or not isinstance(original, dialect.loaded_dbapi.Error):
        return False
    try:
        return bool(dialect.is_disconnect(original, dbapi_connection, None))
    except Exception:  # noqa: BLE001 - a connection that cannot even say is treated as alive
        return False


def sqlite_integrity_problems(connection: Connection, limit: int = 100) -> list[str]:
    """What ``PRAGMA integrity_check`` finds wrong with an SQLite file (empty when it is sound).

    A page so damaged that SQLite refuses to read it is reported as a problem too.
    """
    mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
    try:
        rows = deferred(connection).exec_driver_sql(f"PRAGMA integrity_check({int(limit)})").fetchall()
    except _driver_errors(connection.dialect) as error:
        if not is_corruption(error):
            raise
        return [driver_message(error)]
    finally:
        if connection.in_transaction():
            connection.rollback()
        connection.execution_options(**{SQLITE_BEGIN_OPTION: mode})
    return [" ".join(str(row[0]).replace("*** in database main ***", "").split()) for row in rows if row[0] != "ok"]
