"""The seed's value checks and the one way records apply them: attrs field validators.

A predicate (``non_empty``, ``is_schema_one``, ...) mirrors one of the seed's checks.
Every record declares its checks on its attrs fields (``validator=``): :func:`one_of`
for a set of allowed strings, :func:`of_type` for a plain type check, and otherwise
:func:`field_validator`, which turns a predicate into a validator, or a
module-level ``_validate_*`` function that calls :func:`require` when the check needs
other fields. Ours refuse with :class:`InvalidRecordError` naming the field; a
``from_json`` checks the JSON shape (keys, schema, ``op``) itself and builds its record
inside :func:`as_invalid_record`, so any refused field becomes one error naming the record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeGuard, TypeVar

import attrs

from ._errors import InvalidRecordError
from ._jscompat import is_safe_integer
from ._timestamps import is_canonical_utc_timestamp

SCHEMA_VERSION = 1
# A session id, generation or token becomes a path component; these would escape or alias it.
FORBIDDEN_PATH_COMPONENTS = frozenset({"", ".", ".."})

FieldValidator = Callable[[Any, "attrs.Attribute[Any]", Any], None]
_Record = TypeVar("_Record")


def is_record(value: object) -> TypeGuard[dict[str, Any]]:
    """A JSON object (the seed's ``isRecord``)."""
    return isinstance(value, dict)


def has_only_keys(record: Mapping[str, Any], allowed: Iterable[str]) -> bool:
    """No key outside ``allowed`` (the seed's ``hasOnlyKeys``; missing keys are checked separately)."""
    allowed_set = set(allowed)
    return all(key in allowed_set for key in record)


def has_exact_keys(record: Mapping[str, Any], keys: Iterable[str]) -> bool:
    """Exactly the keys ``keys``, no more and no fewer."""
    return set(record) == set(keys)


def non_empty(value: object) -> TypeGuard[str]:
    """A string of at least one character (the seed's ``nonEmpty``).

    Beyond the seed: without lone surrogates, which JSON parsing already refuses and no
    record could be written with.
    """
    return isinstance(value, str) and len(value) > 0 and _is_utf8(value)


def is_schema_one(value: object) -> bool:
    """``value === 1`` in JavaScript: the number one, never ``true``."""
    return is_safe_integer(value) and value == SCHEMA_VERSION


def is_safe_path_component(value: object) -> TypeGuard[str]:
    """Beyond the seed: a session id, generation or token that becomes a path component.

    Refuses empty, ``.``, ``..``, anything containing ``/`` or NUL, and lone surrogates
    (which no file system can name).
    """
    return (
        isinstance(value, str)
        and value not in FORBIDDEN_PATH_COMPONENTS
        and "/" not in value
        and "\0" not in value
        and _is_utf8(value)
    )


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_optional_str(value: object) -> bool:
    """``None`` or a string."""
    return value is None or isinstance(value, str)


def is_optional_non_empty(value: object) -> bool:
    """``None`` or a non-empty string (JSON ``null`` is refused before this is asked)."""
    return value is None or non_empty(value)


def is_bool(value: object) -> bool:
    """``true`` or ``false``, never a number."""
    return isinstance(value, bool)


def field_validator(check: Callable[[Any], bool]) -> FieldValidator:
    """An attrs field validator that refuses any value ``check`` rejects with ``InvalidRecordError(<field>)``."""

    def validate(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        require(check(value), attribute)

    return validate


def one_of(options: Iterable[str]) -> FieldValidator:
    """A validator accepting exactly the strings ``options``.

    Unlike attrs' ``in_`` it never puts the refused value in its message, so a hostile
    value (say, nested thousands deep) cannot turn a refusal into a ``RecursionError``.
    """
    allowed = frozenset(options)
    return field_validator(lambda value: isinstance(value, str) and value in allowed)


def of_type(kind: type[Any]) -> FieldValidator:
    """A validator accepting instances of ``kind`` (attrs' ``instance_of`` without the value in its message)."""
    return field_validator(lambda value: isinstance(value, kind))


def require(condition: bool, attribute: attrs.Attribute[Any]) -> None:
    """Refuse ``attribute`` unless ``condition``: the failure of every field validator in this package."""
    if not condition:
        raise InvalidRecordError(attribute.name)


validate_non_empty = field_validator(non_empty)
validate_optional_non_empty = field_validator(is_optional_non_empty)
validate_optional_str = field_validator(is_optional_str)
validate_bool = field_validator(is_bool)
validate_canonical_timestamp = field_validator(is_canonical_utc_timestamp)
validate_schema_one = field_validator(is_schema_one)
validate_path_component = field_validator(is_safe_path_component)


class _RefusalsAsInvalidRecord:
    # A class rather than contextlib.contextmanager: its __exit__ returns None, so type
    # checkers know the block never swallows an exception and a `return` inside it counts.
    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, _type: object, error: BaseException | None, _traceback: TracebackType | None) -> None:
        if isinstance(error, (TypeError, ValueError)):
            raise InvalidRecordError(self.what) from error


def as_invalid_record(what: str) -> _RefusalsAsInvalidRecord:
    """Within the block, a constructor's ``TypeError``/``ValueError`` becomes ``InvalidRecordError(what)``.

    ``with as_invalid_record(cls.__name__): return cls(**value)`` is how every
    ``from_json`` turns a refused field into one error naming the record.
    """
    return _RefusalsAsInvalidRecord(what)


def record_with_exact_keys(record: Callable[..., _Record], value: object, keys: Iterable[str]) -> _Record:
    """``record(**value)`` for a JSON object with exactly ``keys``; anything else, or a refused
    field, is ``InvalidRecordError`` naming the record."""
    name = getattr(record, "__name__", "record")
    if not is_record(value) or not has_exact_keys(value, keys):
        raise InvalidRecordError(name)
    with as_invalid_record(name):
        return record(**value)
