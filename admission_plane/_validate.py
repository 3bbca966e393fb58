"""Input checks shared by the service and the value classes (the seed's validators)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Literal, TypeGuard

from .errors import InvalidInputError

MAX_SAFE_INTEGER = 2**53 - 1
#: The longest delay a timer may wait (ms): ``threading`` refuses timeouts beyond about 2**33 s.
MAX_TIMER_MS = 2**31 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UUID_V4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def is_safe_integer(value: object) -> TypeGuard[int]:
    """``Number.isSafeInteger`` for Python values: an ``int`` (never a ``bool``) within +-(2**53 - 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def timestamp(value: object, label: str) -> int:
    """A non-negative safe integer (milliseconds since the epoch)."""
    if not is_safe_integer(value) or value < 0:
        raise InvalidInputError(f"{label} must be a non-negative safe integer")
    return value


def positive_integer(value: object, label: str, maximum: int = MAX_SAFE_INTEGER) -> int:
    """A safe integer in ``1..maximum``."""
    if not is_safe_integer(value) or not 1 <= value <= maximum:
        raise InvalidInputError(f"{label} must be a positive safe integer")
    return value


def is_identifier(value: object) -> TypeGuard[str]:
    """1-256 characters, no surrounding whitespace, no control characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 256
        and value.strip() == value
        and _CONTROL.search(value) is None
        and _encodable(value)
    )


def identifier(value: object, label: str) -> str:
    """The seed's ``validateIdentifier``."""
    if not is_identifier(value):
        raise InvalidInputError(f"{label} must be a non-empty single-line identifier")
    return value


def metadata_text(value: object, label: str) -> str:
    """The seed's enqueue metadata rule: a string, not blank after trimming, without NUL."""
    if not _is_metadata_text(value):
        raise InvalidInputError(f"invalid request metadata {label}")
    return value


def _is_metadata_text(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip()) and "\0" not in value and _encodable(value)


RequestField = Literal["request_id", "session_id", "fingerprint", "provider", "model"]
#: The one rule of each text field of a request, for its write (enqueue) and every later read (the
#: recovery inventory): what one accepts, the other accepts. The seed's enqueue took any non-blank text
#: without NUL while its inventory refused what is not an identifier, so one such request stopped
#: recovery for the whole plane; here session, provider and model are identifiers on both sides.
#: (``request_id`` meets the identifier rule right after, with the journal's message, as in the seed.)
_REQUEST_FIELD_RULES: dict[RequestField, Callable[[object], bool]] = {
    "request_id": _is_metadata_text,
    "session_id": is_identifier,
    "fingerprint": _is_metadata_text,
    "provider": is_identifier,
    "model": is_identifier,
}


def request_field(field: RequestField, value: object) -> str:
    """A request's ``field`` checked by its one rule; ``invalid request metadata <field>`` otherwise."""
    if not isinstance(value, str) or not _REQUEST_FIELD_RULES[field](value):
        raise InvalidInputError(f"invalid request metadata {field}")
    return value


def request_metadata(
    request_id: object, session_id: object, agent_id: object, fingerprint: object, provider: object, model: object
) -> None:
    """A request's metadata, each field by its one rule, in the original's order (each failure its own message)."""
    request_field("request_id", request_id)
    request_field("session_id", session_id)
    request_field("fingerprint", fingerprint)
    request_field("provider", provider)
    request_field("model", model)
    if not isinstance(agent_id, str):
        raise InvalidInputError("invalid request metadata agent_id")
    identifier(agent_id, "request metadata agent_id")


def is_owner_instance_id(value: object) -> TypeGuard[str]:
    """A canonical lowercase UUID v4 (how every connector names its owner instance)."""
    return isinstance(value, str) and _UUID_V4.fullmatch(value) is not None


def owner_instance_id(value: object) -> str:
    """A canonical lowercase UUID v4 (owner ids in process records and queued owners)."""
    if not is_owner_instance_id(value):
        raise InvalidInputError("process record owner instance ID must be a canonical UUID v4")
    return value


def plaintext(value: object) -> str:
    """A prompt: any string that encodes to UTF-8 (lone surrogates are refused)."""
    if not isinstance(value, str) or not _encodable(value):
        raise InvalidInputError("payload plaintext must be a UTF-8 encodable string")
    return value


def delay_ms(value: object, label: str) -> float:
    """A delay in milliseconds: a number above 0 and at most 2**53 - 1 (so never NaN or infinite; never a ``bool``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_SAFE_INTEGER:
        raise InvalidInputError(f"{label} must be a positive finite number of milliseconds")
    return value


def flag(value: object, label: str) -> bool:
    """``True`` or ``False`` (a truthy value is not accepted: a misplaced argument is refused, not guessed)."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{label} must be True or False")
    return value


def file_path(value: object, label: str) -> str:
    """A filesystem path: text (or an ``os.PathLike`` of text) without NUL that the filesystem encoding can encode
    (a lone surrogate outside ``\\udc80``-``\\udcff`` cannot name a file)."""
    text = path_text(value)
    if text is None or "\0" in text or not _fs_encodable(text):
        raise InvalidInputError(f"{label} must be a filesystem path (text without NUL or lone surrogates)")
    return text


def is_clean_text(value: object) -> TypeGuard[str]:
    """Text without NUL that encodes to UTF-8 (what a database driver can be handed)."""
    return isinstance(value, str) and "\0" not in value and _encodable(value)


def command(value: object, label: str) -> tuple[str, ...]:
    """A child's argv: a non-empty list or tuple of text (or ``os.PathLike`` text) without NUL that the filesystem
    encoding can encode, the first item (the program) not empty."""
    items = tuple(path_text(item) for item in value) if isinstance(value, list | tuple) else ()
    argv = tuple(item for item in items if item is not None and "\0" not in item and _fs_encodable(item))
    if not argv or len(argv) != len(items) or not argv[0]:
        raise InvalidInputError(f"{label} must be a non-empty list of strings without NUL")
    return argv


def proc_readers(value: object) -> None:
    """Process readers (:class:`~admission_plane.evidence.ProcReaders`): callable ``read_file`` and ``read_link``
    (``list_process_ids`` may be missing: then there is no process inventory)."""
    if not all(callable(getattr(value, name, None)) for name in ("read_file", "read_link")):
        raise InvalidInputError("process readers must have callable read_file and read_link methods")


def hook(value: object, label: str, *, optional: bool = False) -> None:
    """A callable (or ``None`` when ``optional``): a caller's sleep, clock or callback."""
    if not callable(value) and not (optional and value is None):
        raise InvalidInputError(f"{label} must be callable" + (" or None" if optional else ""))


def path_text(value: object) -> str | None:
    """The text of a ``str`` or an ``os.PathLike`` of text; ``None`` for anything else (bytes included)."""
    if not isinstance(value, str | os.PathLike):
        return None
    try:
        text = os.fspath(value)
    except TypeError:  # an __fspath__ that returns neither str nor bytes
        return None
    return text if isinstance(text, str) else None


def _fs_encodable(value: str) -> bool:
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
