"""One migration at a time per database: a lock held from a migration's first look to its last step.

Why: every migration step is its own transaction, so two upgrades of a fresh database that
start together both find it empty and both run the first step; the later one then fails
half-way (``v2 DDL transaction rolled back``) although the database ends at head. Holding
one lock around the whole run makes a later run start when the earlier one has finished:
it finds the database at head and does nothing.

* PostgreSQL: a session-level advisory lock (:data:`MIGRATION_LOCK_KEY`, not the writers'
  transaction-level key), taken outside any transaction and released at the end, or by the
  server when the connection ends. A caller's connection already inside a transaction takes
  the transaction-level form, released when the caller's transaction ends.
* SQLite: an exclusive ``flock`` on the writer-gate file ``<database>-writer.lock`` that the
  plane's writers queue on, so they too wait until the migration has finished; SQLite's own
  write lock still excludes other programs, step by step. A caller's connection already
  inside a transaction holds SQLite's write lock and takes no file lock.

The wait is bounded: after ``timeout_s`` seconds the migration is refused with
:class:`~admission_plane.errors.AdmissionMigrationError` saying that another one is running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from ..errors import AdmissionMigrationError
from .doorbell import open_gate_file
from .engine import redacted_url, writer_lock_path

__all__ = ["DEFAULT_TIMEOUT_S", "HELD", "MIGRATION_LOCK_KEY", "migration_lock", "sqlite_gate"]

#: The Alembic config attribute saying the caller already holds the SQLite gate (:func:`sqlite_gate`).
HELD = "admission_plane_migration_lock_held"

#: ``pg_advisory_lock`` key of migrations ("admmigr" in ASCII).
MIGRATION_LOCK_KEY = int.from_bytes(b"admmigr", "big")
#: How long a migration waits for another one to finish before it gives up.
DEFAULT_TIMEOUT_S = 300.0
_POLL_S = 0.05


@contextmanager
def migration_lock(connection: Connection, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Hold the database's migration lock (see the module docstring) inside the block."""
    external = connection.in_transaction()
    lock: contextlib.AbstractContextManager[None]
    if connection.dialect.name == "postgresql":
        lock = _advisory_lock(connection, external, timeout_s)
    elif connection.dialect.name == "sqlite" and not external:
        lock = _file_lock(connection, timeout_s)
    else:
        lock = contextlib.nullcontext()
    with lock:
        try:
            yield
        finally:
            # A failed step's transaction ends before the lock is released (a dead connection's
            # rollback failure must not hide the error that ended the migration).
            if not external and connection.in_transaction():
                with contextlib.suppress(SQLAlchemyError):
                    connection.rollback()


def _wait(attempt: Callable[[], bool], timeout_s: float, database: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not attempt():
        if time.monotonic() >= deadline:
            raise AdmissionMigrationError(
                f"another migration of {database} is running (waited {timeout_s:g} s); "
                "run this one again when it has finished"
            )
        time.sleep(_POLL_S)


@contextmanager
def _advisory_lock(connection: Connection, external: bool, timeout_s: float) -> Iterator[None]:
    function = "pg_try_advisory_xact_lock" if external else "pg_try_advisory_lock"

    def attempt() -> bool:
        taken = bool(connection.exec_driver_sql(f"SELECT {function}({MIGRATION_LOCK_KEY})").scalar_one())
        if not external:
            connection.commit()  # the session's lock outlives this transaction; the migration begins its own
        return taken

    _wait(attempt, timeout_s, redacted_url(connection.engine.url))
    try:
        yield
    finally:
        if not external:
            # A lost connection has released the lock with its session already.
            with contextlib.suppress(SQLAlchemyError):
                if connection.in_transaction():
                    connection.rollback()
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                connection.commit()


@contextmanager
def _file_lock(connection: Connection, timeout_s: float) -> Iterator[None]:
    with sqlite_gate(writer_lock_path(connection.engine), str(connection.engine.url.database), timeout_s):
        yield


@contextmanager
def sqlite_gate(path: str | None, database: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Hold the SQLite writer gate ``path`` exclusively in the block (nothing when ``path`` is ``None``).

    :mod:`admission_plane.migrate` takes it before it opens its connection, so that a migration
    waiting for another one does not meet SQLite's own locks while it connects (under load a
    connection's first pragmas could outwait the busy timeout behind another migration's steps).
    """
    # Never through a link, never anything but a regular file; None: an unwritable directory, where
    # SQLite's own lock still serialises each step.
    fd = None if path is None else open_gate_file(path)
    if fd is None:
        yield
        return

    def attempt() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    try:
        _wait(attempt, timeout_s, database)
        yield
    finally:
        os.close(fd)  # releases the flock
