"""Where the command line finds its two 32-byte keys, without ever printing them.

Order: the environment (``ADMISSION_PLANE_ENCRYPTION_KEY`` and
``ADMISSION_PLANE_CONTENT_KEY``, 64 hexadecimal characters each, both or neither), else a
key file holding the same two ``NAME=hex`` lines. The key file lives in the state
directory unless named; it is created with mode 0600 (in a 0700 directory) only when the
caller asks for it, and refused when it is a symbolic link or not a regular file (a FIFO is
refused without waiting for a writer), belongs to another user, is readable or writable by
anyone else, or lies in a directory that anyone else may read or write. The two keys must
differ. Error messages name the variable or the file, never the key material.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

import attrs

from . import _validate as v
from .errors import MissingKeyError

__all__ = [
    "CONTENT_KEY_VARIABLE",
    "ENCRYPTION_KEY_VARIABLE",
    "KeyPair",
    "default_key_file",
    "generate_key_file",
    "load_keys",
    "state_directory",
]

ENCRYPTION_KEY_VARIABLE = "ADMISSION_PLANE_ENCRYPTION_KEY"
CONTENT_KEY_VARIABLE = "ADMISSION_PLANE_CONTENT_KEY"
KEY_FILE_NAME = "keys"
_KEY_HEX_LENGTH = 64
_MAX_KEY_FILE_BYTES = 4096


@attrs.frozen(repr=False)
class KeyPair:
    """The payload encryption key and the content-fingerprint (HMAC) key; the repr hides both."""

    encryption_key: bytes
    content_fingerprint_key: bytes
    source: str

    def __repr__(self) -> str:
        return f"<KeyPair from {self.source}>"


def state_directory() -> Path:
    """``$XDG_STATE_HOME/admission-plane``, else ``~/.local/state/admission-plane``."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "admission-plane"


def default_key_file() -> Path:
    """The key file in :func:`state_directory`."""
    return state_directory() / KEY_FILE_NAME


def load_keys(key_file: str | os.PathLike[str] | None = None, *, create: bool = False) -> KeyPair:
    """Load the keys from the environment, else from ``key_file`` (default :func:`default_key_file`).

    With ``create=True`` a missing key file is generated first. Raises
    :class:`~admission_plane.errors.MissingKeyError` (a one-line message) when no key is
    found or a key source is unsafe or malformed, and
    :class:`~admission_plane.errors.InvalidInputError` when ``key_file`` is not a path
    (see :func:`generate_key_file`), even when the environment holds the keys.
    """
    path = Path(v.file_path(key_file, "key file")) if key_file is not None else default_key_file()
    keys = _keys_from_environment()
    if keys is None:
        if create and not os.path.lexists(path):
            generate_key_file(path)
        keys = _read_key_file(path)
    if hmac.compare_digest(keys.encryption_key, keys.content_fingerprint_key):
        raise MissingKeyError(f"the two keys from {keys.source} are equal; they must differ")
    return keys


def generate_key_file(path: str | os.PathLike[str]) -> Path:
    """Write two fresh random keys to a new file with mode 0600; never overwrites an existing file.

    A ``path`` that is not text (or an ``os.PathLike`` of text), or holds a NUL or a lone
    surrogate, raises :class:`~admission_plane.errors.InvalidInputError` and creates nothing.
    """
    target = Path(v.file_path(path, "key file"))
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise MissingKeyError(f"key directory {target.parent} cannot be created: {error.strerror}") from None
    _check_directory(target.parent)
    text = f"{ENCRYPTION_KEY_VARIABLE}={secrets.token_hex(32)}\n{CONTENT_KEY_VARIABLE}={secrets.token_hex(32)}\n"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(target, flags, 0o600)
    except FileExistsError:
        raise MissingKeyError(f"key file {target} already exists") from None
    except OSError as error:
        raise MissingKeyError(f"key file {target} cannot be created: {error.strerror}") from None
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, text.encode("ascii"))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return target


def _keys_from_environment() -> KeyPair | None:
    encryption = os.environ.get(ENCRYPTION_KEY_VARIABLE)
    content = os.environ.get(CONTENT_KEY_VARIABLE)
    if encryption is None and content is None:
        return None
    if encryption is None or content is None:
        missing = ENCRYPTION_KEY_VARIABLE if encryption is None else CONTENT_KEY_VARIABLE
        raise MissingKeyError(f"{missing} is not set (set both key variables or neither)")
    return KeyPair(
        _decode(encryption, ENCRYPTION_KEY_VARIABLE), _decode(content, CONTENT_KEY_VARIABLE), "the environment"
    )


def read_private_file(path: Path, kind: str, max_bytes: int) -> str:
    """The ASCII text of a secret file (the key file, the operator token file), held to one rule:
    a regular file (no link followed, a FIFO refused at once), ours, mode 0600, in a directory
    only we may use, at most ``max_bytes``. Anything else raises :class:`MissingKeyError` naming
    ``kind`` and ``path``, never the content; a missing file raises :class:`FileNotFoundError`."""
    # Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise MissingKeyError(f"{kind} file {path} cannot be opened: {error.strerror}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise MissingKeyError(f"{kind} file {path} is not a regular file")
        if status.st_uid != os.geteuid():
            raise MissingKeyError(f"{kind} file {path} belongs to another user")
        if status.st_mode & 0o077:
            raise MissingKeyError(
                f"{kind} file {path} is accessible by other users (mode {stat.S_IMODE(status.st_mode):04o}); "
                "run chmod 600 on it"
            )
        _check_directory(path.parent, kind)
        raw = os.read(descriptor, max_bytes + 1)
    finally:
        os.close(descriptor)
    if len(raw) > max_bytes:
        raise MissingKeyError(f"{kind} file {path} is too large")
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise MissingKeyError(f"{kind} file {path} is malformed") from None


def _read_key_file(path: Path) -> KeyPair:
    try:
        text = read_private_file(path, "key", _MAX_KEY_FILE_BYTES)
    except FileNotFoundError:
        raise MissingKeyError(
            f"no keys: set {ENCRYPTION_KEY_VARIABLE} and {CONTENT_KEY_VARIABLE}, "
            f"or create {path} with `admission-plane keys init`"
        ) from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, separator, value = line.partition("=")
        if not separator or name.strip() not in (ENCRYPTION_KEY_VARIABLE, CONTENT_KEY_VARIABLE):
            raise MissingKeyError(f"key file {path} is malformed")
        values[name.strip()] = value.strip()
    for name in (ENCRYPTION_KEY_VARIABLE, CONTENT_KEY_VARIABLE):
        if name not in values:
            raise MissingKeyError(f"key file {path} has no {name}")
    return KeyPair(
        _decode(values[ENCRYPTION_KEY_VARIABLE], f"{ENCRYPTION_KEY_VARIABLE} in {path}"),
        _decode(values[CONTENT_KEY_VARIABLE], f"{CONTENT_KEY_VARIABLE} in {path}"),
        str(path),
    )


def _check_directory(directory: Path, kind: str = "key") -> None:
    """Refuse a directory of secrets that another user owns or may read or write (it must be 0700)."""
    try:
        status = os.stat(directory)
    except OSError as error:
        raise MissingKeyError(f"{kind} directory {directory} cannot be inspected: {error.strerror}") from None
    if status.st_uid != os.geteuid():
        raise MissingKeyError(f"{kind} directory {directory} belongs to another user")
    if status.st_mode & 0o077:
        raise MissingKeyError(
            f"{kind} directory {directory} is accessible by other users (mode {stat.S_IMODE(status.st_mode):04o}); "
            "run chmod 700 on it"
        )


def _decode(text: str, label: str) -> bytes:
    value = text.strip()
    if len(value) != _KEY_HEX_LENGTH or any(char not in "0123456789abcdefABCDEF" for char in value):
        raise MissingKeyError(f"{label} must be {_KEY_HEX_LENGTH} hexadecimal characters (32 bytes)")
    return bytes.fromhex(value)
