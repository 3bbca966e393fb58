"""A no-follow root reader: the Python replacement of the seed's native ``openRecoveryFsRoot``.

The root is opened from ``/`` one component at a time without following symlinks,
and its descriptor is kept, so renaming or replacing the path afterwards does not
redirect reads. Each read walks below the root the same way and accepts only a
regular, single-link file within the size bound, whose content and identity do not
change while it is read twice.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
from typing import Self

import attrs

from ._errors import InvalidRecordError, TmuxOwnerError
from ._validators import is_safe_path_component

MAX_READ_BYTES = 1 << 20
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 64 * 1024


@attrs.frozen
class FileIdentity:
    """What a read proved about the file; numbers are decimal strings, times nanoseconds."""

    dev: str
    ino: str
    nlink: str
    size: str
    mtime_ns: str
    ctime_ns: str
    sha256: str


@attrs.frozen
class RecoveryRead:
    """The outcome of :meth:`RecoveryFsRoot.read`: ``ok`` with data and identity, or a refusal ``code``."""

    ok: bool
    code: str | None = None
    identity: FileIdentity | None = None
    data: bytes | None = None


def _refused(code: str) -> RecoveryRead:
    return RecoveryRead(ok=False, code=code)


class _Refusal(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _components(path: str) -> list[str] | None:
    parts = path.split("/")
    return parts if all(is_safe_path_component(part) for part in parts) else None


def _same_file(left: os.stat_result, right: os.stat_result) -> bool:
    return (left.st_dev, left.st_ino) == (right.st_dev, right.st_ino)


def _unchanged(left: os.stat_result, right: os.stat_result) -> bool:
    return _same_file(left, right) and (left.st_size, left.st_mtime_ns, left.st_ctime_ns, left.st_nlink) == (
        right.st_size,
        right.st_mtime_ns,
        right.st_ctime_ns,
        right.st_nlink,
    )


def _read_all(fd: int, limit: int) -> tuple[bytes, str]:
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    total = 0
    offset = 0
    while True:
        # pread keeps each pass on its own cursor, independent of the descriptor offset.
        chunk = os.pread(fd, _CHUNK, offset)
        if not chunk:
            break
        offset += len(chunk)
        total += len(chunk)
        if total > limit:
            raise _Refusal("content_too_large")
        digest.update(chunk)
        chunks.append(chunk)
    return b"".join(chunks), digest.hexdigest()


class RecoveryFsRoot:
    """A directory held open by descriptor; read files below it without following links.

    Use :meth:`open`; :meth:`close` (or the context manager) releases the root, after
    which every read is refused with ``closed``.
    """

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Self:
        """Open an absolute directory path without following any symlink on the way.

        Raises ``unsupported_platform`` off Linux, ``invalid_path`` for a relative or
        non-normal path, and ``untrusted_root`` when a component is a symlink, not a
        directory, or cannot be opened.
        """
        if not sys.platform.startswith("linux"):
            raise TmuxOwnerError("unsupported_platform")
        # A bytes path or a non-path gets past the annotation at run time; it is refused like a relative one.
        given: object = path
        text = os.fspath(given) if isinstance(given, str | os.PathLike) else None
        if not isinstance(text, str) or not text.startswith("/"):
            raise TmuxOwnerError("invalid_path")
        parts = [] if text.rstrip("/") == "" else _components(text.strip("/"))
        if parts is None:
            raise TmuxOwnerError("invalid_path")
        fd = os.open("/", _DIRECTORY_FLAGS)
        try:
            for part in parts:
                child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except OSError as error:
            os.close(fd)
            raise TmuxOwnerError("untrusted_root") from error
        return cls(fd)

    def close(self) -> None:
        """Release the root descriptor; later reads are refused with ``closed``."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def read(self, relative: str, max_bytes: int = MAX_READ_BYTES) -> RecoveryRead:
        """Read ``relative`` (below the root) as a proven, stable regular file of at most ``max_bytes``.

        Beyond the native module: a ``max_bytes`` that is not an integer raises ``InvalidRecordError``.
        """
        bound: object = max_bytes  # callers outside the type checker may pass anything
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise InvalidRecordError("max_bytes")
        if self._fd is None:
            return _refused("closed")
        name: object = relative  # callers outside the type checker may pass anything
        parts = _components(name) if isinstance(name, str) and not name.startswith("/") else None
        if parts is None:
            return _refused("invalid_path")
        limit = max(0, min(max_bytes, MAX_READ_BYTES))
        parent = self._fd
        owned: list[int] = []
        try:
            for part in parts[:-1]:
                parent = self._open_directory(part, parent)
                owned.append(parent)
            return self._read_file(parent, parts[-1], limit)
        except _Refusal as refusal:
            return _refused(refusal.code)
        finally:
            for fd in owned:
                os.close(fd)

    @staticmethod
    def _open_directory(name: str, parent: int) -> int:
        try:
            return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
        except FileNotFoundError as error:
            raise _Refusal("not_found") from error
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _Refusal("reparse_point") from error
            raise _Refusal("io_error") from error

    @staticmethod
    def _read_file(parent: int, name: str, limit: int) -> RecoveryRead:
        try:
            entry = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError as error:
            raise _Refusal("not_found") from error
        except OSError as error:
            raise _Refusal("io_error") from error
        if stat.S_ISLNK(entry.st_mode):
            raise _Refusal("reparse_point")
        if not stat.S_ISREG(entry.st_mode):
            raise _Refusal("not_regular_file")
        if entry.st_nlink != 1:
            raise _Refusal("hard_link")
        if entry.st_size > limit:
            raise _Refusal("content_too_large")
        data, digest, after = _read_once(parent, name, entry, limit)
        if not _unchanged(entry, after) or len(data) != after.st_size:
            raise _Refusal("identity_mismatch")
        again, again_digest, final = _read_once(parent, name, entry, limit)
        if again_digest != digest or again != data or not _unchanged(entry, final):
            raise _Refusal("identity_mismatch")
        identity = FileIdentity(
            dev=str(after.st_dev),
            ino=str(after.st_ino),
            nlink=str(after.st_nlink),
            size=str(after.st_size),
            mtime_ns=str(after.st_mtime_ns),
            ctime_ns=str(after.st_ctime_ns),
            sha256=digest,
        )
        return RecoveryRead(ok=True, identity=identity, data=data)


def _open_file(parent: int, name: str, entry: os.stat_result) -> int:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except FileNotFoundError as error:
        raise _Refusal("not_found") from error
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _Refusal("reparse_point") from error
        raise _Refusal("io_error") from error
    opened = os.fstat(fd)
    if not _same_file(entry, opened) or not stat.S_ISREG(opened.st_mode) or opened.st_nlink != 1:
        os.close(fd)
        raise _Refusal("identity_mismatch")
    return fd


def _read_once(parent: int, name: str, entry: os.stat_result, limit: int) -> tuple[bytes, str, os.stat_result]:
    """Open ``name`` as the file ``entry`` names, read it whole, and stat it again before closing."""
    fd = _open_file(parent, name, entry)
    try:
        data, digest = _read_all(fd, limit)
        return data, digest, os.fstat(fd)
    finally:
        os.close(fd)


def open_recovery_fs_root(path: str | os.PathLike[str]) -> RecoveryFsRoot:
    """The seed's ``openRecoveryFsRoot``."""
    return RecoveryFsRoot.open(path)
