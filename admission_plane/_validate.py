"""Input checks shared by the service and the value classes (the seed's validators)."""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from .errors import InvalidInputError

MAX_SAFE_INTEGER = 2**53 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UUID_V4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def is_safe_integer(value: object) -> TypeGuard[int]:
    """``Number.isSafeInteger`` for Python values: an ``int`` (never a ``bool``) within +-(2**53 - 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def timestamp(value: Any, label: str) -> int:
    """A non-negative safe integer (milliseconds since the epoch)."""
    if not is_safe_integer(value) or value < 0:
        raise InvalidInputError(f"{label} must be a non-negative safe integer")
    return value


def positive_integer(value: Any, label: str, maximum: int = MAX_SAFE_INTEGER) -> int:
    """A safe integer in ``1..maximum``."""
    if not is_safe_integer(value) or not 1 <= value <= maximum:
        raise InvalidInputError(f"{label} must be a positive safe integer")
    return value


def is_identifier(value: Any) -> bool:
    """1-256 characters, no surrounding whitespace, no control characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= 256
        and value.strip() == value
        and _CONTROL.search(value) is None
        and _encodable(value)
    )


def identifier(value: Any, label: str) -> str:
    """The seed's ``validateIdentifier``."""
    if not is_identifier(value):
        raise InvalidInputError(f"{label} must be a non-empty single-line identifier")
    return value


def metadata_text(value: Any, label: str) -> str:
    """The seed's enqueue metadata rule: a string, not blank after trimming, without NUL."""
    if not isinstance(value, str) or not value.strip() or "\0" in value or not _encodable(value):
        raise InvalidInputError(f"invalid request metadata {label}")
    return value


def is_owner_instance_id(value: object) -> TypeGuard[str]:
    """A canonical lowercase UUID v4 (how every connector names its owner instance)."""
    return isinstance(value, str) and _UUID_V4.fullmatch(value) is not None


def owner_instance_id(value: Any) -> str:
    """A canonical lowercase UUID v4 (owner ids in process records and queued owners)."""
    if not is_owner_instance_id(value):
        raise InvalidInputError("process record owner instance ID must be a canonical UUID v4")
    return value


def plaintext(value: Any) -> str:
    """A prompt: any string that encodes to UTF-8 (lone surrogates are refused)."""
    if not isinstance(value, str) or not _encodable(value):
        raise InvalidInputError("payload plaintext must be a UTF-8 encodable string")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
