"""One session's lifecycle directory, opened without following a symlink anywhere below the state directory.

The state directory is the caller's choice and is opened as given, even through a
symlink. Below it, ``<session_id>`` and ``owner-lifecycle`` are opened one at a time with
``O_NOFOLLOW | O_DIRECTORY`` relative to their parent's descriptor, so a symlink (or
anything else than a directory) there refuses the call with ``untrusted_root``. Every
file is then read, created, renamed, linked and removed relative to the lifecycle
directory's descriptor: a path swapped after the walk cannot redirect any of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any, Self

from ._errors import TmuxOwnerError
from ._jscompat import loads

DIR_MODE = 0o700
FILE_MODE = 0o600
LIFECYCLE_DIRECTORY = "owner-lifecycle"
MAX_RECORD_BYTES = 1 << 20
# The longest file name Linux file systems hold, in bytes.
NAME_MAX = 255
# A directory component below the state directory that is a symlink or not a directory.
UNTRUSTED_ROOT = "untrusted_root"
# A lifecycle file the package would replace, rename onto or lock that is a symlink or not a regular file.
UNTRUSTED_FILE = "untrusted_lifecycle_file"
INVALID_STATE_DIR = "invalid_state_dir"

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def state_dir_path(state_dir: object) -> Path:
    """``state_dir`` as a path, or ``invalid_state_dir`` for anything the file system cannot name.

    Refuses non-paths, bytes paths, the empty string (which would silently mean the
    working directory), NUL, and text the file-system encoding cannot represent.
    """
    text = os.fspath(state_dir) if isinstance(state_dir, os.PathLike) else state_dir
    if not isinstance(text, str) or not text or "\0" in text:
        raise TmuxOwnerError(INVALID_STATE_DIR)
    try:
        os.fsencode(text)
    except UnicodeEncodeError as error:
        raise TmuxOwnerError(INVALID_STATE_DIR) from error
    return Path(text)


def _untrusted_directory(error: OSError) -> bool:
    # O_NOFOLLOW on a symlink fails with ELOOP; O_DIRECTORY on anything else with ENOTDIR.
    return error.errno in (errno.ELOOP, errno.ENOTDIR)


def _open_state_dir(state_dir: Path, *, create: bool) -> int | None:
    try:
        try:
            return os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
        os.makedirs(state_dir, exist_ok=True)
        return os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        # A path that is no directory, too long, or loops through symlinks names no state directory.
        if error.errno in (errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EEXIST):
            raise TmuxOwnerError(INVALID_STATE_DIR) from error
        raise


def _open_directory(parent: int, name: str) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except OSError as error:
        if _untrusted_directory(error):
            raise TmuxOwnerError(UNTRUSTED_ROOT) from error
        raise


def _open_below(parent: int, name: str, *, create: bool) -> int | None:
    try:
        return _open_directory(parent, name)
    except FileNotFoundError:
        if not create:
            return None
    # A concurrent creator may win; opening it afterwards checks what it made.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, DIR_MODE, dir_fd=parent)
    return _open_directory(parent, name)


class LifecycleDir:
    """``<state_dir>/<session_id>/owner-lifecycle`` held open; every method works relative to its descriptor.

    Use :meth:`open` as a context manager. ``path`` names the directory for SQLite and
    for messages only; no file operation goes through it.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, state_dir: object, session_id: str) -> Self | None:
        """The verified lifecycle directory, or ``None`` when it (or the state directory) does not exist.

        Raises ``untrusted_root`` when the session or lifecycle directory is a symlink or
        not a directory, and ``invalid_state_dir`` for an unusable state directory.
        """
        return cls._walk(state_dir, session_id, create=False)

    @classmethod
    def create(cls, state_dir: object, session_id: str) -> Self:
        """The verified lifecycle directory, creating what is missing (the state directory as given, the rest 0700)."""
        directory = cls._walk(state_dir, session_id, create=True)
        if directory is None:
            raise FileNotFoundError(errno.ENOENT, "lifecycle directory removed while it was created")
        return directory

    @classmethod
    def _walk(cls, state_dir: object, session_id: str, *, create: bool) -> Self | None:
        base = state_dir_path(state_dir)
        fd = _open_state_dir(base, create=create)
        for name in (session_id, LIFECYCLE_DIRECTORY):
            if fd is None:
                return None
            try:
                child = _open_below(fd, name, create=create)
            finally:
                os.close(fd)
            fd = child
        if fd is None:
            return None
        return cls(fd, base / session_id / LIFECYCLE_DIRECTORY)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` itself (a symlink is not followed), or ``None`` if absent."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        """Whether anything (file, directory or symlink) is named ``name``."""
        return self.lstat(name) is not None

    def require_replaceable(self, name: str) -> None:
        """Refuse with ``untrusted_lifecycle_file`` unless ``name`` is absent or a regular file."""
        entry = self.lstat(name)
        if entry is not None and not stat.S_ISREG(entry.st_mode):
            raise TmuxOwnerError(UNTRUSTED_FILE)

    def read_bytes(self, name: str, limit: int = MAX_RECORD_BYTES) -> bytes | None:
        """A regular file's content; ``None`` if absent, a symlink, not regular, or over ``limit`` bytes."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                return None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                return None
            chunks: list[bytes] = []
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

    def read_json(self, name: str) -> dict[str, Any] | None:
        """The seed's ``readJson``: a JSON object, or ``None`` when absent, unreadable, not JSON or not an object.

        A symlink at ``name`` reads as ``None`` (beyond the seed).
        """
        try:
            data = self.read_bytes(name)
            if data is None:
                return None
            value = loads(data)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def rename(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` in this directory; a symlink at ``target`` is refused.

        ``rename`` would replace a symlink rather than follow it, but a symlink where a
        record belongs means the directory was tampered with, so nothing is moved onto it.
        """
        entry = self.lstat(target)
        if entry is not None and stat.S_ISLNK(entry.st_mode):
            raise TmuxOwnerError(UNTRUSTED_FILE)
        os.rename(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)

    def listdir(self) -> list[str]:
        return os.listdir(self.fd)

    def fsync(self) -> None:
        """Make the creations, renames and links in this directory durable."""
        os.fsync(self.fd)
