"""Group commit outside the gates: a writing unit commits under its gate and waits for the disk after it.

**SQLite.**

With ``synchronous=FULL`` an SQLite commit in WAL mode appends the transaction's frames to the
``-wal`` file and then ``fsync``\\ s it, all under the database's write lock, which this library's
writers hold through the writer gate (:class:`~admission_plane.store.unit_of_work.UnitOfWork`). The
flush is about two thirds of a writing unit's hold of the gate on an ordinary disk, and no other
writer may begin meanwhile: with several processes on one file, the disk's flushes were the queue.

A unit of work's writing transaction therefore commits with ``synchronous=NORMAL`` (the frames are
written, not flushed), leaves the gate, and only then flushes the ``-wal`` file with ``fdatasync``,
before the operation returns to its caller. Writers flush side by side, each while the next holds
the gate, and the file system serves concurrent flushes of one file together.

Why the caller's guarantee is the one ``FULL`` gives, *an operation that returned is durable*:

* ``fdatasync`` on any descriptor of the ``-wal`` file flushes every frame written to it so far,
  the unit's own commit and every commit before it;
* SQLite replays the ``-wal`` file after a crash only up to the first frame whose cumulative
  checksum fails, so what survives a power loss is a prefix of the commits, never a later commit
  without an earlier one;
* frames leave the ``-wal`` file only by a checkpoint, which (``NORMAL`` as ``FULL``) flushes the
  ``-wal`` file before it copies the frames and the database file after; a ``-wal`` file missing
  when the unit flushes was checkpointed and removed, so the unit's frames are in the flushed
  database file.

What differs: another connection may *read* a commit in the moment between its write and its flush.
If the machine loses power in that moment, the commit and the processes that read it are lost
together (SQLite serves one machine), and whatever a reader does that must outlive a power loss it
does by a commit of its own (an admission, a dispatch intent), whose flush covers the commit it read.
So no turn is dispatched on a state that a power loss can take back: the dispatch intent is flushed
before :meth:`~admission_plane.AdmissionPlane.commit_dispatch_intent` returns.

Only a connection whose database is in WAL mode is relaxed (``journal_mode=WAL`` may be refused, by a
file system without shared memory for instance; a rollback journal keeps ``FULL``). Every transaction
begun through a SQLAlchemy ``Connection`` (migrations, the operator's reads and writes outside the hot
path) puts its connection back to ``FULL`` first (:func:`strict`), so only the unit of work flushes
by itself.

**PostgreSQL.** A unit that holds the admission gate at its commit (an admission, an enqueue, a lease unit
that changes a count admission reads: ``Gate.ADMISSION``, ``Gate.ENQUEUE``, ``Gate.EXCLUSIVE``, an ordered
``Gate.LEASE`` unit) held it through the commit's WAL flush: the server releases a transaction's locks
after the flush, so every admission waited for the previous one's disk, and the server's own group commit
could not gather them. Such a unit now commits with ``SET LOCAL synchronous_commit = off`` (the commit
record is written, the locks released, the flush not awaited), and the same round trip then runs
:data:`POSTGRES_FLUSH`, a transaction of one WAL record (a transactional logical-decoding message with the
prefix ``admission_plane`` and no content) whose commit, synchronous as the session says, flushes the WAL up
to itself, which is past the unit's commit. What the gate serialises is unchanged: the server makes a
commit visible before it releases the transaction's locks, flush awaited or not, so the next holder of the
gate reads everything the previous one committed. The durability argument is the one above: the WAL is
one sequence, so a flush (and a synchronous standby's confirmation) covers every commit before it; what a
crash takes back is a suffix, never a commit without the ones before it; a reader acts durably only by a
commit of its own, whose flush covers what it read. Another host may read the unit's commit before its
flush, as another connection may on SQLite.

The flush needs ``EXECUTE`` on ``pg_logical_emit_message`` (PUBLIC by default; a connection checks once,
when it opens, :func:`postgres_flush_allowed`) and session state (a connection made behind a pooler,
``prepare_threshold=None``, is not checked); without it the unit commits synchronously under its gate, as
before. If the flush transaction fails after the unit's commit (the connection lost, the privilege revoked
since the connection checked), the operation raises :class:`~admission_plane.errors.AdmissionDatabaseError`
although its unit committed, as when a connection is lost during a commit. Logical-decoding consumers that
ask for messages see one empty ``admission_plane`` message per such commit (``pgoutput`` ignores them unless
``messages`` is on).
"""

from __future__ import annotations

import errno
import os
from collections.abc import MutableMapping
from typing import Any

from ..errors import AdmissionDatabaseError

#: The pooled connection's ``info`` key holding its ``-wal`` file's path, ``None`` unless its database is in WAL
#: mode (set when it connects, from the file SQLite itself opened: :func:`wal_file`).
WAL_INFO = "admission_plane.wal"
#: The pooled connection's ``info`` key holding its current ``synchronous`` setting.
SYNCHRONOUS_INFO = "admission_plane.synchronous"
RELAXED, STRICT = "NORMAL", "FULL"
#: The pooled PostgreSQL connection's ``info`` key saying :data:`POSTGRES_FLUSH` may run on it.
POSTGRES_FLUSH_INFO = "admission_plane.postgres_flush"
#: Said before a gated PostgreSQL unit's ``COMMIT``: the commit releases the gate without awaiting the flush.
POSTGRES_ASYNC = "SET LOCAL synchronous_commit = off"
#: Run right after that ``COMMIT``, in the same round trip: a transaction that writes one WAL record, so that
#: its commit flushes the WAL (a transaction that wrote none would not), past the unit's commit record.
POSTGRES_FLUSH = "BEGIN; SELECT pg_logical_emit_message(true, 'admission_plane', ''); COMMIT"
_FLUSH_ALLOWED = (
    "SELECT has_function_privilege('pg_catalog.pg_logical_emit_message(boolean, text, text)', 'EXECUTE')"
    " AND NOT pg_is_in_recovery()"
)


def wal_file(dbapi_connection: Any, journal_mode: object) -> str | None:
    """The ``-wal`` file of the connection's main database as SQLite opened it (``PRAGMA database_list``: an
    absolute path, whatever form the URL gave, ``file:`` URIs included), or ``None`` if ``journal_mode`` (what
    ``PRAGMA journal_mode = WAL`` answered) is not ``wal`` or the database has no file."""
    if str(journal_mode).lower() != "wal":
        return None
    for _seq, name, file in dbapi_connection.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return wal_path(file) if file else None
    return None


def relaxed(dbapi_connection: Any, info: MutableMapping[Any, Any]) -> str | None:
    """Put the connection in ``synchronous=NORMAL`` if its database is in WAL mode; then the ``-wal`` file a
    committed unit must flush (:func:`make_durable`) before it returns, else ``None``. Outside a transaction."""
    wal = info.get(WAL_INFO)
    if not wal:
        return None
    if info.get(SYNCHRONOUS_INFO) != RELAXED:
        dbapi_connection.execute(f"PRAGMA synchronous = {RELAXED}")
        info[SYNCHRONOUS_INFO] = RELAXED
    return str(wal)


def strict(execute: Any, info: MutableMapping[Any, Any]) -> None:
    """Put the connection back in ``synchronous=FULL`` (every commit flushed by SQLite itself), if a unit
    of work relaxed it; ``execute`` runs one statement on it. Outside a transaction."""
    if info.get(SYNCHRONOUS_INFO) == RELAXED:
        execute(f"PRAGMA synchronous = {STRICT}")
        info[SYNCHRONOUS_INFO] = STRICT


def wal_path(database: str) -> str:
    """The ``-wal`` file of the SQLite database file ``database``."""
    return f"{database}-wal"


def make_durable(wal: str) -> None:
    """Flush the ``-wal`` file ``wal`` (every commit written to it so far).

    Raises :class:`AdmissionDatabaseError` if the flush fails: the commit happened, but it may not
    survive a power loss, and the operation must not be reported as durable.
    """
    try:
        fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # links followed, as SQLite does
    except FileNotFoundError:
        return  # checkpointed and removed: its frames are in the database file, flushed by the checkpoint
    except OSError as error:
        raise _not_durable(error) from None
    try:
        os.fdatasync(fd)
    except OSError as error:
        raise _not_durable(error) from None
    finally:
        os.close(fd)


def _not_durable(error: OSError) -> AdmissionDatabaseError:
    reason = errno.errorcode.get(error.errno or 0, "unknown error")
    return AdmissionDatabaseError(
        f"database error: the commit was written but flushing the SQLite -wal file failed ({reason}); "
        "it may not survive a power loss"
    )


def postgres_flush_allowed(dbapi_connection: Any) -> bool:
    """Whether this PostgreSQL connection (autocommit, idle) may run :data:`POSTGRES_FLUSH` (one round trip)."""
    row = dbapi_connection.execute(_FLUSH_ALLOWED, prepare=False).fetchone()
    return bool(row and row[0])


def postgres_commit(ending: str) -> str:
    """A gated PostgreSQL unit's ``ending`` (``[SELECT pg_notify(...);] COMMIT``), committed without awaiting the
    flush under the gate, then flushed (:data:`POSTGRES_ASYNC`, :data:`POSTGRES_FLUSH`)."""
    return f"{POSTGRES_ASYNC}; {ending}; {POSTGRES_FLUSH}"
