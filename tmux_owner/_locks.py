"""The lifecycle lock: a ``BEGIN IMMEDIATE`` transaction held on ``owner-locks.sqlite``.

Every lock kind shares the one database, as in the seed. The database is opened only
after it was proved to be a regular file reached through the verified lifecycle
directory: it is created exclusively (``O_NOFOLLOW``, 0600) and checked and chmodded
through an ``O_PATH`` descriptor, a symlink at it or at its ``-journal``/``-wal``/``-shm``
side files is refused with ``untrusted_lifecycle_file``, and SQLite, which can only open
by name, gets the name the kernel gives that descriptor and must open the same file.
The lock never writes a page, so SQLite never creates a side file. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
import uuid
from pathlib import Path

from ._dirfd import FILE_MODE, UNTRUSTED_FILE, LifecycleDir
from ._errors import TmuxOwnerError

LOCK_DATABASE = "owner-locks.sqlite"
SIDE_FILE_SUFFIXES = ("-journal", "-wal", "-shm")
VERDICT_LOCK_WAIT_MS = 250
GENERATION_LOCK_WAIT_MS = 7_000
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_registry_lock = threading.Lock()


class SqliteLock:
    """A held lifecycle lock. Use :func:`acquire_lock`; release with :meth:`release` (commits, or rolls back).

    Locks held by this process are tracked in-process by the lifecycle directory's identity,
    so a process never races its own duplicate holders, however the state directory is spelled.
    """

    _live: dict[str, SqliteLock] = {}  # noqa: RUF012 - process-wide registry by design

    def __init__(self, file: Path, identity: tuple[int, int], connection: sqlite3.Connection, token: str) -> None:
        self.file = file
        self.identity = identity
        self.token = token
        self._connection: sqlite3.Connection | None = connection

    @property
    def active(self) -> bool:
        return self._connection is not None

    def release(self, *, commit: bool = True) -> None:
        """End the transaction: COMMIT (falling back to ROLLBACK), or ROLLBACK when ``commit`` is false."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        with _registry_lock:
            SqliteLock._live.pop(self.token, None)
        try:
            connection.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
        finally:
            connection.close()

    def __enter__(self) -> SqliteLock:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.release(commit=exc_type is None)


def _open_database(directory: LifecycleDir) -> int:
    """An ``O_PATH`` descriptor of the lock database (created 0600 if missing); refuses all but a lone regular file.

    ``O_PATH`` matters: closing any ordinary descriptor of the database would drop every
    POSIX lock this process holds on it, SQLite's included; closing an ``O_PATH`` one does not.
    """
    for suffix in SIDE_FILE_SUFFIXES:
        side = directory.lstat(LOCK_DATABASE + suffix)
        if side is not None and not stat.S_ISREG(side.st_mode):
            raise TmuxOwnerError(UNTRUSTED_FILE)
    while True:
        try:
            fd = os.open(LOCK_DATABASE, _PATH_FLAGS, dir_fd=directory.fd)
            break
        except FileNotFoundError:
            pass
        # A new, empty file is a valid SQLite database; a concurrent creator may win.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(LOCK_DATABASE, _CREATE_FLAGS, FILE_MODE, dir_fd=directory.fd))
    info = os.fstat(fd)
    # With O_PATH, O_NOFOLLOW opens a symlink itself instead of failing: fstat shows it.
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise TmuxOwnerError(UNTRUSTED_FILE)
    if stat.S_IMODE(info.st_mode) != FILE_MODE:
        # The seed chmods the database to 0600; through the descriptor's /proc name only this file can change.
        os.chmod(_proc_name(fd), FILE_MODE)
    return fd


def _proc_name(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _connect(fd: int) -> sqlite3.Connection:
    """Connect SQLite to the file behind ``fd`` without letting it create anything, and prove it opened that file."""
    info = os.fstat(fd)
    # SQLite resolves the descriptor's /proc name to the file's real path and opens that;
    # mode=rw keeps it from ever creating a file wherever that name might point.
    connection = sqlite3.connect(
        f"file:{_proc_name(fd)}?mode=rw", uri=True, timeout=0, isolation_level=None, check_same_thread=False
    )
    try:
        opened = Path(connection.execute("PRAGMA database_list").fetchone()[2])
        again = os.stat(opened)
    except (sqlite3.Error, OSError, TypeError, IndexError) as error:
        connection.close()
        raise TmuxOwnerError(UNTRUSTED_FILE) from error
    if (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):
        connection.close()
        raise TmuxOwnerError(UNTRUSTED_FILE)
    return connection


def _try_begin_immediate(directory: LifecycleDir) -> SqliteLock | None:
    where = os.fstat(directory.fd)
    identity = (where.st_dev, where.st_ino)
    # Only an instantaneous attempt happens under the registry lock, so in-process waiters
    # queue on the registry while cross-process waiters rely on busy_timeout=0 polling.
    with _registry_lock:
        if any(lock.identity == identity and lock.active for lock in SqliteLock._live.values()):
            return None
        fd = _open_database(directory)
        try:
            connection = _connect(fd)
        except sqlite3.Error:
            return None
        finally:
            os.close(fd)
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            connection.close()
            return None
        lock = SqliteLock(directory.path / LOCK_DATABASE, identity, connection, str(uuid.uuid4()))
        SqliteLock._live[lock.token] = lock
        return lock


def acquire_lock(directory: LifecycleDir, wait_ms: int) -> SqliteLock | None:
    """Take the lifecycle lock within ``wait_ms``; ``None`` on timeout or a SQLite failure (fail closed).

    Raises ``untrusted_lifecycle_file`` when the database or a side file is a symlink or
    not a regular file, or when SQLite would open another file than the verified one.
    """
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        lock = _try_begin_immediate(directory)
        if lock is not None:
            return lock
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(0.01, remaining))
