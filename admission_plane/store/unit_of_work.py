"""One transaction boundary per operation.

``with UnitOfWork(engine) as uow: ...; uow.commit()`` — the transaction rolls back
unless :meth:`UnitOfWork.commit` was called.

Why this is enough to serialise admission:

* SQLite: a writing unit begins with ``BEGIN IMMEDIATE``, which takes the database's
  single write lock before the first read. Counting seats and taking one therefore happen
  under one lock, across threads and processes. Writers of this library first queue on a
  kernel file lock (:class:`_WriterGate`), so the write lock passes straight to the next
  of them; against other programs they wait on ``busy_timeout`` instead of failing
  half-way through. A writing unit commits under the gate and flushes the ``-wal`` file
  after it, before it returns (:mod:`admission_plane.store.group_commit`), so the next
  writer's work and this unit's flush overlap.
* PostgreSQL: there is no database-wide write lock, and ``READ COMMITTED`` lets two
  hosts both count the same free seat. Writing units therefore take transaction-level
  advisory locks (released at commit or rollback) on two keys: the *admission gate*
  :data:`ADVISORY_LOCK_KEY` and the *lease gate* :data:`LEASE_LOCK_KEY`, as their
  :class:`Gate` says:

  - ``Gate.ADMISSION``: the admission gate, **exclusively**, for the whole unit. Admission
    (seat counting, selection, reservation, and the time-out of queued requests it sweeps
    first) and the journal's readers. Admissions run one at a time, each statement after
    the lock sees every transaction committed before it (READ COMMITTED takes a new
    snapshot per statement), and no unit that could raise a count admission reads is in
    flight beside it: the seat count, the selection and the reservation are consistent.
  - ``Gate.ENQUEUE``: the admission gate **shared**, for the whole unit: enqueues run beside
    each other and beside lease units, never beside an admission, which reads the queue
    index they write (why that is enough for them:
    :data:`admission_plane.service._enqueue.ENQUEUE_GATE`).
  - ``Gate.LEASE``: the lease gate **shared** for the whole unit, and the admission gate
    **shared** in its commit's round trip only, before its journal events. The fenced
    transitions of one existing lease (starting, dispatch intent, active, heartbeat,
    suspicion, completion, abandonment, recovery, the seat releases) run beside each
    other, beside enqueues *and beside an admission*, so their commits overlap and share
    WAL flushes (group commit). A lease unit locks the rows it relies on itself: its first
    read is the lease row ``FOR UPDATE``, so two units of the *same* lease (a heartbeat and
    a completion) run one after the other. Why a lease unit needs no more, operation by
    operation, is in :mod:`admission_plane.service._lifecycle`; in short, a lease unit
    only lowers what admission counts (seats, the start window), writes nothing else
    admission reads but a start, a cooldown and a settled budget, and reads nothing an
    admission writes but the start window (covered there). The admission gate at commit
    puts every lease unit wholly before or wholly after each admission: one that takes it
    first has committed before the admission's first read, so the admission saw it; one
    that takes it later commits after the admission has committed. An admission may thus
    read a seat as still held that a lease unit is freeing (it waits, as it would have a
    moment earlier), but never acts on half of a lease unit, and the journal's sequence
    numbers, taken at commit under that lock, order every lease unit's events on the same
    side of each admission's as its commit (what the journal replay of the tests relies
    on: ``tests/admission/journal_replay.py``). A lease unit whose writes change nothing
    admission counts or reads (a start with no start interval, a dispatch intent: the lease
    stays in the start window) says so (``Tx.count_neutral``) and commits without it; the
    order of its events against an admission's is then free, and no count depends on it.
  - ``Gate.EXCLUSIVE`` (the default): the lease gate and then the admission gate, both
    **exclusively**: cancels, policy changes and pauses, cooldowns set by hand, the reaper's
    queued-owner settlements, and every other writer that does not say otherwise. It runs
    alone, exactly as every writer did before the gates were split.

  Lock order, so no two units wait for each other in a circle: the lease gate, then the
  admission gate (each queued before any other statement, except a lease unit's admission
  gate), then the lease row, then the start or drain lock, then other rows. A lease unit
  takes the admission gate after its lease row; that closes no circle, because the units
  that hold the admission gate beside a lease unit never wait for anything a lease unit
  holds: enqueues and admissions write only rows no lease unit writes (queued requests, new
  leases and budget reservations, the queue index; admission's prune of old budget charges
  skips reserved ones, the only ones a lease unit changes), and none of them takes the lease
  gate or a start or drain lock. Serialization failures and deadlocks (40001, 40P01) are
  retried a bounded number of times; every operation is safe to re-run from the start
  because it reads all its state inside the transaction.

  Round trips: the driver connection is used in autocommit mode and the unit opens its
  transaction itself: ``BEGIN`` and its gates (constant text) travel with the unit's first
  statement in one round trip of the simple query protocol, as ``EXECUTE`` of that statement
  prepared by name on the connection (:meth:`~admission_plane.store.tx.Tx.open`); the unit
  ends with ``NOTIFY`` (only while someone listens: :mod:`.doorbell`) and ``COMMIT`` in one
  more (a lease unit's admission gate too), which
  also carries the writes nobody in the unit reads back (the journal's event, the sends still
  held back: :meth:`~admission_plane.store.tx.Tx.send`); every other statement is prepared on
  the server (``prepare_threshold=0``, :mod:`.engine`). psycopg's own implicit ``BEGIN`` and
  the pool's pre-ping would each cost a round trip per unit. (psycopg's pipeline mode, tried
  too, loses the server's reason when it ends the connection, and was no faster.) A unit that
  reads nothing (a lease unit sent whole, :class:`SentUnitRefused`; a waiter's admission the server
  decides, :func:`admission_plane.service._admission.blind_applies`) sends its opening with its
  commit: one round trip, and an admission's gate is then held for the server's work only.
  Read-only units take no lock and no transaction (autocommit; each READ COMMITTED
  statement has its own snapshot anyway), unless they ask for the gate:
  :func:`admission_plane.service._journal.read_page` takes both gates exclusively
  (``Gate.EXCLUSIVE``) for an instant, so that every event it returns was committed before
  any event it has not yet seen could be (event sequence numbers of overlapping lease units
  are taken before their commits, which may land in another order; every writing unit takes
  its events' numbers under one of the gates, at least shared, held to its commit).
"""

from __future__ import annotations

import enum
import fcntl
import logging
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Engine, func, literal, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from ..errors import AdmissionBusyError, AdmissionDatabaseError, AdmissionError, AdmissionStateError, LeaseFenceError
from . import group_commit
from .advisory import ADVISORY_LOCK_KEY, DRAIN_LOCK_KEY, LEASE_LOCK_KEY, START_LOCK_KEY
from .doorbell import CHANNEL, RELEASE_ASKED, SOMEONE_LISTENS, Chimes, open_gate_file, ring
from .engine import SQLITE_BEGIN, writer_lock_path
from .failures import CONNECTION_LOST, connection_lost, driver_message
from .parking import Parking, give_back, parking_for
from .session_functions import FENCE_REFUSED, REQUEST_DIVERGED, SENT_REFUSED
from .tx import Statement, Tx

T = TypeVar("T")
_LOG = logging.getLogger(__name__)
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open on the connection

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
#: ``invalid_sql_statement_name``: a statement the unit prepared by name on its connection was deallocated by
#: something else (:meth:`Tx.forget_prepared` covers the library's own rollbacks); the rollback has made the
#: connection forget them all, and the unit runs again from the start.
_PREPARED_LOST = "26000"
DEFAULT_ATTEMPTS = 5
_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT "
_BEGIN_EXCLUSIVE = f"{_BEGIN}pg_advisory_xact_lock({LEASE_LOCK_KEY}); SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})"
_BEGIN_ADMISSION = f"{_BEGIN}pg_advisory_xact_lock({ADVISORY_LOCK_KEY})"
_BEGIN_ENQUEUE = f"{_BEGIN}pg_advisory_xact_lock_shared({ADVISORY_LOCK_KEY})"
_BEGIN_LEASE = f"{_BEGIN}pg_advisory_xact_lock_shared({LEASE_LOCK_KEY})"
#: What a lease unit's commit round trip runs first (see the module docstring).
_LEASE_COMMIT_GATE = f"SELECT pg_advisory_xact_lock_shared({ADVISORY_LOCK_KEY})"


def _lock(function: str, key: int) -> Statement:
    return Statement(select(getattr(func, function)(literal(key, BigInteger))))


#: The start lock, exclusive and shared, and the drain lock (see the constants above).
START_LOCK = _lock("pg_advisory_xact_lock", START_LOCK_KEY)
SHARED_START_LOCK = _lock("pg_advisory_xact_lock_shared", START_LOCK_KEY)
DRAIN_LOCK = _lock("pg_advisory_xact_lock", DRAIN_LOCK_KEY)
#: The admission gate, shared, taken early by a lease unit that must not run beside an admission
#: at all (a soft drain's completion, which counts the seats admission could take).
ADMISSION_GATE_SHARED = _lock("pg_advisory_xact_lock_shared", ADVISORY_LOCK_KEY)


class SentUnitRefused(Exception):
    """PostgreSQL: a unit sent whole with its commit found the database otherwise than it assumed
    (``pg_temp.admission_plane_expect_sent`` raised ``SENT_REFUSED``). Nothing was committed; the
    operation runs again the long way, reading first (:meth:`admission_plane.service._context.PlaneContext.run_sent`).
    """


class Gate(enum.Enum):
    """How a PostgreSQL unit takes the plane's advisory locks (see the module docstring)."""

    EXCLUSIVE = "both gates exclusively: serialised against every other writer"
    ADMISSION = "the admission gate exclusively: one admission at a time, beside lease units"
    ENQUEUE = "the admission gate shared: beside lease units and other enqueues, never beside an admission"
    LEASE = "the lease gate shared, the admission gate shared at commit: beside everything but EXCLUSIVE"


_BEGINS = {
    Gate.EXCLUSIVE: _BEGIN_EXCLUSIVE,
    Gate.ADMISSION: _BEGIN_ADMISSION,
    Gate.ENQUEUE: _BEGIN_ENQUEUE,
    Gate.LEASE: _BEGIN_LEASE,
}


class UnitOfWork:
    """One transaction on a pooled DB-API connection; rolls back unless :meth:`commit` was called.

    Every statement of an operation runs on the connection's cursor (see
    :mod:`admission_plane.store.tx`), so the transaction is driven on the driver connection
    too: SQLite gets an explicit ``BEGIN IMMEDIATE`` (``BEGIN`` when read-only), PostgreSQL
    a pipelined ``BEGIN`` followed by the gate (:class:`Gate`), or, read-only without a
    gate, no transaction at all.
    """

    def __init__(self, engine: Engine, *, read_only: bool = False, gate: Gate | None = None) -> None:
        self._engine = engine
        self._read_only = read_only
        self._gate_mode = gate if gate is not None or read_only else Gate.EXCLUSIVE
        self._committed = False
        self._open = False
        #: SQLite: the ``-wal`` file this unit's commit is written to but not flushed (``store.group_commit``).
        self._flush_after: str | None = None
        #: Whether the commit round trip asked whether anyone listens (see ``_end_postgres``).
        self._asked = False
        self.tx: Tx
        #: Whether the transaction ended because the database connection was lost (it was discarded).
        self.connection_lost = False
        #: PostgreSQL: where this unit may keep its connection for the next (:mod:`.parking`), and the pool
        #: the connection came from.
        self._parking: Parking | None = None
        self._pool: Any = None

    def __enter__(self) -> UnitOfWork:
        dialect = self._engine.dialect
        self._gate = None
        # Pool checkout and return happen outside the writer gate: the gate is held only
        # from just before ``BEGIN IMMEDIATE`` until the transaction has ended.
        self._parking = parking_for(self._engine)
        self._pool = self._engine.pool  # a kept connection is one of this pool's (Parking.take)
        connection = None if self._parking is None else self._parking.take()
        if connection is None:
            connection = self._engine.raw_connection()
        try:
            if dialect.name == "sqlite":
                if not self._read_only:
                    # Before the gate: a connection is switched once, and this unit's commit then
                    # leaves the flush to ``__exit__``, after the gate (``store.group_commit``).
                    self._flush_after = group_commit.relaxed(connection.dbapi_connection, connection.info)
                    self._gate = _WriterGate.enter(self._engine)
                tx = Tx(connection, dialect)
                tx.begin(SQLITE_BEGIN["DEFERRED" if self._read_only else "IMMEDIATE"])
            else:
                tx = self._begin_postgres(connection, dialect)
        except BaseException as error:
            self._leave_gate()
            if dialect.name == "postgresql":
                self._end_postgres(connection)
            self._release(connection, lost=connection_lost(dialect, error, connection.dbapi_connection))
            raise
        self._connection = connection
        self.tx = tx
        return self

    def _begin_postgres(self, connection: PoolProxiedConnection, dialect: Any) -> Tx:
        """Autocommit on the driver connection; a writing or gated unit opens its transaction with the gate."""
        raw: Any = connection.dbapi_connection
        if not raw.autocommit:  # a kept connection (store.parking) is in autocommit already
            raw.autocommit = True
        if self._gate_mode is None:
            return Tx(connection, dialect)  # read-only: each statement is its own snapshot anyway
        shared = self._gate_mode is Gate.LEASE or self._gate_mode is Gate.ENQUEUE
        tx = Tx(connection, dialect, shared=shared, batched=True)
        opening = _BEGINS[self._gate_mode]
        tx.open(opening, opening.count(";") + 1)
        self._open = True
        return tx

    def _end_postgres(self, connection: PoolProxiedConnection) -> bool:
        """Roll back what is still open; whether the driver connection is now idle (it may be kept)."""
        raw: Any = connection.dbapi_connection
        if raw is None or raw.closed:
            return False
        if raw.pgconn.transaction_status != _IDLE:
            if self._asked:  # the commit failed, perhaps between taking the listeners' lock and releasing it
                raw.execute(f"ROLLBACK; {RELEASE_ASKED}", prepare=False)  # one round trip
            else:
                raw.rollback()
            Tx.forget_prepared(connection.info)
        return True

    def _release(self, connection: PoolProxiedConnection, *, lost: bool, idle: bool = False) -> None:
        """Keep an ``idle`` PostgreSQL ``connection`` for the next unit (:mod:`.parking`) or return it to the
        pool, or discard it when it was ``lost``: the pool would try to roll a dead connection back and print
        that failure's traceback to stderr."""
        if lost:
            self.connection_lost = True
            connection.invalidate()
            return
        if idle and self._parking is not None and self._parking.keep(connection, self._pool):  # a QueuePool
            return
        if self._engine.dialect.name == "postgresql":
            give_back(connection)  # in the mode the pool lent it (which resets it again on return)
        else:
            connection.close()  # back to the pool (which resets it again on return)

    def _leave_gate(self) -> None:
        if self._gate is not None:
            self._gate.leave()
            self._gate = None

    def commit(self) -> None:
        """Commit the work; it is durable once the unit has ended. A unit under a gate awaits the flush
        after the gate (:mod:`~admission_plane.store.group_commit`): SQLite in ``__exit__``, PostgreSQL in
        the commit's round trip."""
        if self._engine.dialect.name == "postgresql":
            if self._open:
                # NOTIFY is delivered by the server only if, and when, the transaction commits.
                rings = self.tx.rings
                ordered = self._gate_mode is Gate.LEASE and not self.tx.count_neutral
                gate = (_LEASE_COMMIT_GATE,) if ordered else ()
                # Whether the unit holds the admission gate (exclusive or shared) at its commit.
                admission_gated = ordered or self._gate_mode is not Gate.LEASE
                ending = "COMMIT"
                if rings:
                    # Only while someone listens, which the unit may ask only under the admission gate
                    # (the doorbell's "Who is told"); a count-neutral lease unit does not hold it.
                    notify = f"SELECT pg_notify('{CHANNEL}', '{rings.payload()}')"
                    if admission_gated:
                        notify = f"{notify} WHERE {SOMEONE_LISTENS}"
                        self._asked = True
                    ending = f"{notify}; COMMIT"
                if admission_gated and self._connection.info.get(group_commit.POSTGRES_FLUSH_INFO):
                    # The gate is released before the flush is awaited, and the same round trip then
                    # flushes (``store.group_commit``).
                    ending = group_commit.postgres_commit(ending)
                self.tx.command("; ".join((*self.tx.closing(*gate), ending)))
                self.tx.carried_rows()
            self._committed = True
            self._prepare_carried()
            return
        self._connection.commit()
        self._committed = True
        if self._gate is not None and self.tx.rings:
            self._gate.ring(self.tx.rings)

    def _prepare_carried(self) -> None:
        """After a PostgreSQL commit: prepare what the commit carried as text (:meth:`Tx.prepare_carried`).
        The unit has committed, so no failure here may reach its caller as the unit's: a connection that
        died since is found out by the next unit that uses it, as it would have been anyway."""
        try:
            self.tx.prepare_carried()
        except self._engine.dialect.loaded_dbapi.Error as error:
            _LOG.debug("statements not prepared after a commit (%s)", type(error).__name__)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        dialect, dbapi_connection = self._engine.dialect, self._connection.dbapi_connection
        lost = exc is not None and connection_lost(dialect, exc, dbapi_connection)
        idle = False
        try:
            if not lost:
                self.tx.close()
                if dialect.name == "postgresql":
                    # Only a unit that ended as planned keeps its connection (store.parking).
                    idle = self._end_postgres(self._connection) and exc is None
                elif not self._committed:
                    self._connection.rollback()
        except dialect.loaded_dbapi.Error as error:
            # The rollback failed: if the connection died, the error that found it out is the news.
            if exc is None or not connection_lost(dialect, error, dbapi_connection):
                raise
            lost = True
        finally:
            # The transaction is over: let the next writer in before the pool return.
            self._leave_gate()
            self._release(self._connection, lost=lost, idle=idle)
        if self._committed and self._flush_after:
            # Outside the gate, so that the next writer's work and this flush overlap; before the
            # operation returns, so that what returned is durable.
            group_commit.make_durable(self._flush_after)


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


def _driver_error(error: BaseException) -> BaseException:
    """The driver's own exception behind ``error`` (SQLAlchemy wraps it in a ``DBAPIError``)."""
    return error.orig if isinstance(error, DBAPIError) and error.orig is not None else error


def _sqlstate(error: BaseException) -> str | None:
    """PostgreSQL's ``SQLSTATE`` of ``error`` (``None`` for SQLite and for errors without one)."""
    state: object = getattr(_driver_error(error), "sqlstate", None)
    return state if isinstance(state, str) else None


def contention_name(error: BaseException) -> str | None:
    """The SQLite error name or PostgreSQL SQLSTATE if ``error`` is lock contention, else ``None``."""
    name: object = getattr(_driver_error(error), "sqlite_errorname", None)
    if isinstance(name, str) and name in SQLITE_CONTENTION:
        return name
    state = _sqlstate(error)
    if state is not None and (state in POSTGRES_RETRYABLE or state == "55P03"):  # lock_not_available
        return state
    return None


def _refused_on_server(error: BaseException) -> AdmissionError | None:
    """The library's error for a PostgreSQL refusal raised by one of its own server-side checks
    (:data:`~admission_plane.store.session_functions.FENCE_REFUSED`, ``REQUEST_DIVERGED``), else ``None``."""
    state = _sqlstate(error)
    if state == FENCE_REFUSED:
        return LeaseFenceError()
    if state == REQUEST_DIVERGED:
        message = getattr(getattr(_driver_error(error), "diag", None), "message_primary", None)
        return AdmissionStateError(message or "lease and request state diverged")
    return None


def run(
    engine: Engine,
    work: Callable[[Tx], T],
    *,
    read_only: bool = False,
    gate: Gate | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work`` in one unit of work and commit; translate driver errors.

    ``gate`` says how a PostgreSQL unit takes the plane's advisory locks (:class:`Gate`;
    default: both exclusively when writing, not at all when ``read_only``). Domain errors
    raised by ``work`` propagate unchanged (after rollback). PostgreSQL
    serialization failures and deadlocks are retried up to ``attempts`` times; lock
    contention that outlasts the retries becomes :class:`AdmissionBusyError`, any
    other driver error :class:`AdmissionDatabaseError`; when the connection was lost
    (the server ended it) its message begins ``database connection was lost:``, the dead
    connection is discarded without a rollback, and the operation is not retried (a lost
    commit may or may not have happened).
    """
    driver_error = engine.dialect.loaded_dbapi.Error
    for attempt in range(attempts):
        uow = UnitOfWork(engine, read_only=read_only, gate=gate)
        try:
            with uow:
                result = work(uow.tx)
                uow.commit()
                return result
        except (DBAPIError, driver_error) as error:
            if uow.connection_lost:
                raise AdmissionDatabaseError(f"{CONNECTION_LOST}: {driver_message(error)}") from error
            if _sqlstate(error) == SENT_REFUSED:
                raise SentUnitRefused() from error
            refusal = _refused_on_server(error)
            if refusal is not None:  # a check sent with the commit refused it: nothing was committed
                raise refusal from error
            name = contention_name(error)
            lost_statement = _sqlstate(error) == _PREPARED_LOST
            if (name in POSTGRES_RETRYABLE or lost_statement) and attempt < attempts - 1:
                time.sleep(0.005 * (attempt + 1))
                continue
            if name is not None:
                raise AdmissionBusyError(f"database is busy ({name})") from error
            detail = error.orig if isinstance(error, DBAPIError) else error
            raise AdmissionDatabaseError(f"database error: {detail}") from error
    raise AssertionError("unreachable")  # pragma: no cover
