"""One transaction boundary per operation.

``with UnitOfWork(engine) as uow: ...; uow.commit()`` — the transaction rolls back
unless :meth:`UnitOfWork.commit` was called.

Why this is enough to serialise admission:

* SQLite: a writing unit begins with ``BEGIN IMMEDIATE``, which takes the database's
  single write lock before the first read. Counting seats and taking one therefore happen
  under one lock, across threads and processes. Writers of this library first queue on a
  kernel file lock (:class:`_WriterGate`), so the write lock passes straight to the next
  of them; against other programs they wait on ``busy_timeout`` instead of failing
  half-way through.
* PostgreSQL: there is no database-wide write lock, and ``READ COMMITTED`` lets two
  hosts both count the same free seat. Every writing unit therefore first takes one
  transaction-level advisory lock (:data:`ADVISORY_LOCK_KEY`), released at commit or
  rollback. Writers are serialised exactly as on SQLite, and each statement after the
  lock sees every transaction committed before it (READ COMMITTED takes a new snapshot
  per statement), so the seat count, the selection and the reservation are consistent.
  Read-only units take no lock. Serialization failures and deadlocks (40001, 40P01) are
  retried a bounded number of times; every operation is safe to re-run from the start
  because it reads all its state inside the transaction.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from sqlalchemy import BigInteger, Engine, bindparam, func, literal, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from ..errors import AdmissionBusyError, AdmissionDatabaseError
from .doorbell import CHANNEL, Chimes, open_gate_file, ring
from .engine import SQLITE_BEGIN, writer_lock_path
from .failures import CONNECTION_LOST, connection_lost, driver_message
from .tx import Statement, Tx

T = TypeVar("T")

#: ``pg_advisory_xact_lock`` key shared by every writer of one plane ("admissn" in ASCII).
ADVISORY_LOCK_KEY = 0x61646D697373_6E
SQLITE_CONTENTION = frozenset(
    {
        "SQLITE_BUSY",
        "SQLITE_BUSY_RECOVERY",
        "SQLITE_BUSY_SNAPSHOT",
        "SQLITE_BUSY_TIMEOUT",
        "SQLITE_LOCKED",
        "SQLITE_LOCKED_SHAREDCACHE",
    }
)
POSTGRES_RETRYABLE = frozenset({"40001", "40P01"})
DEFAULT_ATTEMPTS = 5
_LOCK_STATEMENT = Statement(select(func.pg_advisory_xact_lock(literal(ADVISORY_LOCK_KEY, BigInteger))))
_NOTIFY_STATEMENT = Statement(select(func.pg_notify(literal(CHANNEL), bindparam("bells"))))


class UnitOfWork:
    """One transaction on a pooled DB-API connection; rolls back unless :meth:`commit` was called.

    Every statement of an operation runs on the connection's cursor (see
    :mod:`admission_plane.store.tx`), so the transaction is driven on the driver connection
    too: SQLite gets an explicit ``BEGIN IMMEDIATE`` (``BEGIN`` when read-only), PostgreSQL
    an implicit transaction whose first statement takes the advisory lock.
    """

    def __init__(self, engine: Engine, *, read_only: bool = False) -> None:
        self._engine = engine
        self._read_only = read_only
        self._committed = False
        self.tx: Tx
        #: Whether the transaction ended because the database connection was lost (it was discarded).
        self.connection_lost = False

    def __enter__(self) -> UnitOfWork:
        dialect = self._engine.dialect
        self._gate = None
        # Pool checkout and return happen outside the writer gate: the gate is held only
        # from just before ``BEGIN IMMEDIATE`` until the transaction has ended.
        connection = self._engine.raw_connection()
        try:
            if dialect.name == "sqlite" and not self._read_only:
                self._gate = _WriterGate.enter(self._engine)
            tx = Tx(connection, dialect)
            if dialect.name == "sqlite":
                tx.begin(SQLITE_BEGIN["DEFERRED" if self._read_only else "IMMEDIATE"])
            elif not self._read_only:
                tx.execute(_LOCK_STATEMENT)
        except BaseException as error:
            self._leave_gate()
            self._release(connection, lost=connection_lost(dialect, error, connection.dbapi_connection))
            raise
        self._connection = connection
        self.tx = tx
        return self

    def _release(self, connection: PoolProxiedConnection, *, lost: bool) -> None:
        """Return ``connection`` to the pool, or discard it when it was ``lost``: the pool would try
        to roll a dead connection back and print that failure's traceback to stderr."""
        if lost:
            self.connection_lost = True
            connection.invalidate()
            return
        connection.close()  # back to the pool (which resets it again on return)

    def _leave_gate(self) -> None:
        if self._gate is not None:
            self._gate.leave()
            self._gate = None

    def commit(self) -> None:
        """Make the work durable (``synchronous=FULL`` on SQLite: durable on return)."""
        if self.tx.rings and self._engine.dialect.name == "postgresql":
            # Delivered by the server only if, and when, the transaction commits.
            self.tx.execute(_NOTIFY_STATEMENT, {"bells": self.tx.rings.payload()})
        self._connection.commit()
        self._committed = True
        if self._gate is not None and self.tx.rings:
            self._gate.ring(self.tx.rings)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        dialect, dbapi_connection = self._engine.dialect, self._connection.dbapi_connection
        lost = exc is not None and connection_lost(dialect, exc, dbapi_connection)
        try:
            if not lost:
                self.tx.close()
                if not self._committed:
                    self._connection.rollback()
        except dialect.loaded_dbapi.Error as error:
            # The rollback failed: if the connection died, the error that found it out is the news.
            if exc is None or not connection_lost(dialect, error, dbapi_connection):
                raise
            lost = True
        finally:
            # The transaction is over: let the next writer in before the pool return.
            self._leave_gate()
            self._release(self._connection, lost=lost)


class _WriterGate:
    """An exclusive ``flock`` on ``<database>-writer.lock``, held around each SQLite write.

    Why: SQLite hands its write lock over by polling (every waiter sleeps and retries), so
    with several writing processes the lock often sits free while all of them sleep. Writers
    of this library first queue on this file lock instead, and the kernel wakes one waiter
    the moment the holder releases it; ``BEGIN IMMEDIATE`` then normally succeeds at once.
    Other programs that do not take the gate (the original connector, the ``sqlite3`` shell)
    are still excluded by SQLite's own lock, which writers wait for as before; a migration
    holds the gate from its first step to its last (:mod:`admission_plane.store.migration_lock`).
    Each unit opens its own file description, so threads of one process queue too. The lock
    is released by ``close`` and by the kernel when a process dies; a writer whose holder is
    *stopped* (SIGSTOP) waits until it resumes or dies. The file's first bytes hold the
    admission doorbell (:mod:`admission_plane.store.doorbell`), rung by the holder after commit.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def enter(cls, engine: Engine) -> _WriterGate | None:
        path = writer_lock_path(engine)
        if path is None:
            return None
        fd = open_gate_file(path)  # refuses a link or anything but a regular file
        if fd is None:
            return None  # an unwritable directory: SQLite's own lock still serialises writers
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def ring(self, delta: Chimes) -> None:
        """Ring the doorbell kept in this file (see :mod:`admission_plane.store.doorbell`); needs the lock."""
        ring(self._fd, delta)

    def leave(self) -> None:
        os.close(self._fd)  # releases the flock


def contention_name(error: BaseException) -> str | None:
    """The SQLite error name or PostgreSQL SQLSTATE if ``error`` is lock contention, else ``None``."""
    original = error.orig if isinstance(error, DBAPIError) else error
    name: object = getattr(original, "sqlite_errorname", None)
    if isinstance(name, str) and name in SQLITE_CONTENTION:
        return name
    state: object = getattr(original, "sqlstate", None)
    if isinstance(state, str) and (state in POSTGRES_RETRYABLE or state == "55P03"):  # lock_not_available
        return state
    return None


def run(
    engine: Engine,
    work: Callable[[Tx], T],
    *,
    read_only: bool = False,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work`` in one unit of work and commit; translate driver errors.

    Domain errors raised by ``work`` propagate unchanged (after rollback). PostgreSQL
    serialization failures and deadlocks are retried up to ``attempts`` times; lock
    contention that outlasts the retries becomes :class:`AdmissionBusyError`, any
    other driver error :class:`AdmissionDatabaseError`; when the connection was lost
    (the server ended it) its message begins ``database connection was lost:``, the dead
    connection is discarded without a rollback, and the operation is not retried (a lost
    commit may or may not have happened).
    """
    driver_error = engine.dialect.loaded_dbapi.Error
    for attempt in range(attempts):
        uow = UnitOfWork(engine, read_only=read_only)
        try:
            with uow:
                result = work(uow.tx)
                uow.commit()
                return result
        except (DBAPIError, driver_error) as error:
            if uow.connection_lost:
                raise AdmissionDatabaseError(f"{CONNECTION_LOST}: {driver_message(error)}") from error
            name = contention_name(error)
            if name in POSTGRES_RETRYABLE and attempt < attempts - 1:
                time.sleep(0.005 * (attempt + 1))
                continue
            if name is not None:
                raise AdmissionBusyError(f"database is busy ({name})") from error
            detail = error.orig if isinstance(error, DBAPIError) else error
            raise AdmissionDatabaseError(f"database error: {detail}") from error
    raise AssertionError("unreachable")  # pragma: no cover
