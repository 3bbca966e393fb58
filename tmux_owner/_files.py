"""Lifecycle file layout and the durable file primitives every record goes through.

Layout (the seed's ``lifecyclePaths``): all files of one session live in
``<state_dir>/<session_id>/owner-lifecycle/``, created 0700; files are 0600.
Writes are either an atomic replace (temp file, fsync, rename, fsync directory) or an
immutable publication (exclusive create, fsync, fsync directory). Reads never follow a
symlink at the final component: a symlinked record reads as absent/corrupt.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal, get_args

import attrs

from ._errors import TmuxOwnerError
from ._jscompat import dumps_line, encode_uri_component, loads
from ._validators import is_safe_path_component

FILE_MODE = 0o600
DIR_MODE = 0o700
VERDICT_LOCK_WAIT_MS = 250
GENERATION_LOCK_WAIT_MS = 7_000

RetiredIntentSuffix = Literal[".consumed", ".cancelled", ".expired", ".invalidated"]
RETIRED_INTENT_SUFFIXES: tuple[RetiredIntentSuffix, ...] = get_args(RetiredIntentSuffix)


@attrs.frozen
class LifecyclePaths:
    """Every file of one session's owner lifecycle, for one generation."""

    root: Path
    generation: str
    generation_file: Path
    generation_marker_file: Path
    intent_file: Path
    verdict_file: Path
    verdict_alias_file: Path
    incident_file: Path
    lock_database_file: Path
    journal_file: Path

    def retired_intent_file(self, suffix: RetiredIntentSuffix) -> Path:
        """``intent-<G>.json<suffix>``: the intent once consumed, cancelled, expired or invalidated."""
        return self.intent_file.with_name(self.intent_file.name + suffix)

    def attempt_file(self, token: str) -> Path:
        """``attempt-<token>.json``: a scoped-bootstrap capability."""
        require_path_component(token, "token")
        return self.root / f"attempt-{token}.json"


def require_path_component(value: object, what: str) -> str:
    """Refuse a value that would escape or confuse the lifecycle directory (beyond the seed)."""
    if not is_safe_path_component(value):
        raise TmuxOwnerError(f"invalid_{what}")
    return value


def lifecycle_paths(state_dir: str | os.PathLike[str], session_id: str, generation: str) -> LifecyclePaths:
    """The seed's ``lifecyclePaths``; refuses unsafe session ids and generations."""
    require_path_component(session_id, "session_id")
    require_path_component(generation, "generation")
    root = Path(state_dir) / session_id / "owner-lifecycle"
    return LifecyclePaths(
        root=root,
        generation=generation,
        generation_file=root / "generation.json",
        generation_marker_file=root / f"generation-{encode_uri_component(generation)}.published.json",
        intent_file=root / f"intent-{generation}.json",
        verdict_file=root / f"verdict-{generation}.json",
        verdict_alias_file=root / "verdict.json",
        incident_file=root / f"incident-{generation}.json",
        lock_database_file=root / "owner-locks.sqlite",
        journal_file=root / f"verdict-{generation}.journal",
    )


@attrs.frozen
class MemoryGuardClaimPaths:
    """The seed's ``memoryGuardClaimPaths``."""

    root: Path
    database_file: Path
    wal_file: Path
    shm_file: Path


def memory_guard_claim_paths(state_dir: str | os.PathLike[str], session_id: str) -> MemoryGuardClaimPaths:
    require_path_component(session_id, "session_id")
    root = Path(state_dir) / "memory-guard-claims" / session_id
    database = root / "claims.sqlite"
    return MemoryGuardClaimPaths(
        root=root,
        database_file=database,
        wal_file=Path(f"{database}-wal"),
        shm_file=Path(f"{database}-shm"),
    )


def ensure_directory(path: Path) -> None:
    """Create ``path`` (and parents) with mode 0700 if missing."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def fsync_directory(path: Path) -> None:
    """Make a rename or create in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new_file(path: Path, data: bytes) -> None:
    """Create ``path`` exclusively (0600, no symlink follow), write ``data`` and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, record: Any) -> None:
    """Replace ``path`` with ``record`` atomically: temp file, fsync, rename, fsync directory.

    A failure leaves the previous file untouched and no temp file behind.
    """
    temp = path.with_name(f"{path.name}.{uuid.uuid4()}.tmp")
    data = dumps_line(record)
    try:
        _write_new_file(temp, data)
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_directory(path.parent)


def publish_exclusive(path: Path, record: Any) -> bool:
    """Publish an immutable record with exclusive create; ``False`` if ``path`` already exists."""
    data = dumps_line(record)
    try:
        _write_new_file(path, data)
    except FileExistsError:
        return False
    except BaseException:
        # A partly written new file must not survive as a corrupt immutable record.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    fsync_directory(path.parent)
    return True


def read_bytes_no_follow(path: Path, limit: int = 1 << 20) -> bytes | None:
    """Read a regular file without following a symlink at ``path``; ``None`` if absent or unsafe."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(65536, remaining))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        return None if len(data) > limit else data
    finally:
        os.close(fd)


def read_json_record(path: Path) -> dict[str, Any] | None:
    """The seed's ``readJson``: a JSON object, or ``None`` when absent, unreadable, not JSON or not an object.

    A symlink at ``path`` reads as ``None`` (beyond the seed).
    """
    try:
        data = read_bytes_no_follow(path)
        if data is None:
            return None
        value = loads(data)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def exists_no_follow(path: Path) -> bool:
    """Whether anything (file, directory or link) exists at ``path`` itself."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


class SqliteLock:
    """A lifecycle lock: a ``BEGIN IMMEDIATE`` transaction held on ``owner-locks.sqlite``.

    Every lock kind shares the one database, as in the seed. Locks held by this process
    are also tracked in-process so a process never races its own duplicate holders.
    Use :func:`acquire_lock`; release with :meth:`release` (commits, or rolls back on failure).
    """

    _live: dict[str, SqliteLock] = {}  # noqa: RUF012 - process-wide registry by design

    def __init__(self, file: Path, connection: sqlite3.Connection, token: str) -> None:
        self.file = file
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


_registry_lock = threading.Lock()


def acquire_lock(root: Path, lock_file: Path, wait_ms: int) -> SqliteLock | None:
    """Take the lifecycle lock within ``wait_ms``; ``None`` on timeout or any failure (fail closed)."""
    deadline = time.monotonic() + wait_ms / 1000
    try:
        ensure_directory(root)
    except OSError:
        return None
    while True:
        with _registry_lock:
            held_here = any(lock.file == lock_file and lock.active for lock in SqliteLock._live.values())
            if not held_here:
                lock = _try_begin_immediate(lock_file, deadline)
                if lock is not None:
                    SqliteLock._live[lock.token] = lock
                    return lock
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(0.01, remaining))


def _try_begin_immediate(lock_file: Path, deadline: float) -> SqliteLock | None:
    # Only an instantaneous attempt happens under the registry lock, so in-process
    # waiters queue on the registry while cross-process waiters rely on busy_timeout=0 polling.
    try:
        connection = sqlite3.connect(lock_file, timeout=0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return None
    try:
        with contextlib.suppress(OSError):
            os.chmod(lock_file, FILE_MODE)
        connection.execute("BEGIN IMMEDIATE")
    except sqlite3.Error:
        connection.close()
        return None
    return SqliteLock(lock_file, connection, str(uuid.uuid4()))
