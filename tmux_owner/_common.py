"""Shared primitives: the error types, JavaScript string and JSON semantics, the seed's value
checks, and the attrs field validators every record uses.

Every record in this package is compact JSON, byte-identical to JavaScript's
``JSON.stringify``; every check here mirrors one of the seed's predicates.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeGuard, TypeVar

import attrs

SCHEMA_VERSION = 1
MAX_SAFE_INTEGER = 2**53 - 1
MAX_LINE_BYTES = 16 * 1024
MAX_DIAGNOSTIC_CHARS = 512


class TmuxOwnerError(Exception):
    """A lifecycle operation refused; ``code`` (and ``str()``) is the seed's bare code.

    Example codes: ``generation_replay``, ``immutable_record_conflict``,
    ``immutable_record_corrupt``, ``verdict_lock_timeout``.
    """

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return self.code


class InvalidRecordError(TmuxOwnerError, ValueError):
    """A JSON value does not have the exact shape the seed accepts for a record."""

    def __init__(self, record: str) -> None:
        super().__init__("invalid_record")
        self.record = record

    def __str__(self) -> str:
        return f"invalid_record: {self.record}"


def utf8_length(text: str) -> int:
    """Length in UTF-8 bytes (a lone surrogate counts as its three encoded bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def js_length(value: str) -> int:
    """``String.prototype.length``: UTF-16 code units (a non-BMP character counts 2)."""
    return len(value.encode("utf-16-le")) // 2


# JavaScript's String.prototype.trim set: Python's str.strip() differs (it strips
# U+001C..U+001F and U+0085, and keeps U+FEFF).
_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(value: str) -> str:
    """JavaScript's ``String.prototype.trim``."""
    return value.strip(_JS_WHITESPACE)


def dumps(value: Any) -> str:
    """Serialise exactly as JavaScript's ``JSON.stringify`` (compact, non-ASCII raw)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps_line(value: Any) -> bytes:
    """The on-disk form of a record: compact JSON, one trailing newline, UTF-8."""
    return (dumps(value) + "\n").encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def loads(text: str | bytes) -> Any:
    """Parse JSON as JavaScript's ``JSON.parse`` would, but refuse NaN/Infinity and lone surrogates."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    value = json.loads(text, parse_constant=_reject_constant)
    _reject_surrogates(value)
    return value


def _reject_surrogates(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError("lone surrogate in JSON string") from error
    elif isinstance(value, list):
        for item in value:
            _reject_surrogates(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _reject_surrogates(key)
            _reject_surrogates(item)


def is_record(value: Any) -> TypeGuard[dict[str, Any]]:
    """A JSON object (the seed's ``isRecord``)."""
    return isinstance(value, dict)


def has_only_keys(record: Mapping[str, Any], allowed: Iterable[str]) -> bool:
    """No key outside ``allowed`` (the seed's ``hasOnlyKeys``; missing keys are checked separately)."""
    allowed_set = set(allowed)
    return all(key in allowed_set for key in record)


def has_exact_keys(record: Mapping[str, Any], keys: Iterable[str]) -> bool:
    """Exactly the keys ``keys``, no more and no fewer."""
    return set(record) == set(keys)


def non_empty(value: Any) -> bool:
    """A string of at least one character (the seed's ``nonEmpty``)."""
    return isinstance(value, str) and len(value) > 0


def is_safe_integer(value: Any) -> bool:
    """``Number.isSafeInteger``: an int (never a bool) within +-(2**53 - 1).

    An integral float such as ``12.0`` is accepted, as JavaScript cannot tell it
    from ``12``; JSON parsed by :func:`loads` yields ``12.0`` only for ``12.0`` text.
    """
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER
    return False


def js_number(value: Any) -> Any:
    """Store an integral float as the int JavaScript would have parsed (``12.0`` is ``12``)."""
    if isinstance(value, float) and value.is_integer() and is_safe_integer(value):
        return int(value)
    return value


def is_schema_one(value: Any) -> bool:
    """``value === 1`` in JavaScript: the number one, never ``true``."""
    return is_safe_integer(value) and value == SCHEMA_VERSION


_CANONICAL_UTC = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{3}))?Z")


def is_canonical_utc_timestamp(value: Any) -> bool:
    """A real UTC instant written ``YYYY-MM-DDTHH:MM:SS[.mmm]Z`` (the seed's ``isCanonicalUtcTimestamp``)."""
    if not isinstance(value, str):
        return False
    match = _CANONICAL_UTC.fullmatch(value)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    if not 1 <= month <= 12 or hour > 23 or minute > 59 or second > 59:
        return False
    return 1 <= day <= _days_in_month(year, month)


def iso_now(now_ms: int | None = None) -> str:
    """JavaScript's ``new Date().toISOString()``: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    millis = int(time.time() * 1000) if now_ms is None else now_ms
    moment = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def current_ms() -> int:
    """Milliseconds since the epoch, like JavaScript's ``Date.now()``."""
    return time.time_ns() // 1_000_000


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    # Howard Hinnant's algorithm: proleptic Gregorian, also for year 0 and negative years
    # (which datetime cannot hold). Python's // already floors: no C-style era fix-up.
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


_ISO_DATE = re.compile(
    r"(?P<year>[0-9]{4})(?:-(?P<month>[0-9]{2})(?:-(?P<day>[0-9]{2}))?)?"
    r"(?:T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?)?"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2}))?"
)


def parse_timestamp_ms(value: Any) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 UTC-or-offset timestamp, as ``Date.parse`` reads it.

    The intents' and verdicts' reading. Accepts every canonical timestamp, date-only
    forms (UTC), and ``Z``/``+HH:MM`` offsets. Deliberately stricter than JavaScript:
    out-of-range fields (``02-29`` in a common year, ``T24:00``) and zone-less
    date-times (local time in JS) are refused instead of rolled over or localised.
    ``None`` means unparseable.
    """
    if not isinstance(value, str):
        return None
    match = _ISO_DATE.fullmatch(value)
    if match is None:
        return None
    year = int(match["year"])
    month = int(match["month"] or 1)
    day = int(match["day"] or 1)
    hour, minute, second = int(match["hour"] or 0), int(match["minute"] or 0), int(match["second"] or 0)
    if not 1 <= month <= 12 or not 1 <= day <= _days_in_month(year, month):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    millis = int((match["fraction"] or "0")[:3].ljust(3, "0"))
    offset_minutes = 0
    zone = match["zone"]
    if zone not in (None, "Z"):
        zone_hours, zone_minutes = int(zone[1:3]), int(zone[4:6])
        if zone_hours > 23 or zone_minutes > 59:
            return None
        offset_minutes = (zone_hours * 60 + zone_minutes) * (1 if zone[0] == "+" else -1)
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset_minutes * 60
    return seconds * 1000 + millis


_ES_DATE = re.compile(
    r"([+-][0-9]{6}|[0-9]{4})(?:-([0-9]{2})(?:-([0-9]{2}))?)?"
    r"(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?"
)


def parse_js_date_ms(value: object) -> int | None:
    """Milliseconds of an ECMAScript date-time string (``YYYY[-MM[-DD]][THH:mm[:ss[.sss]]][Z|±HH:mm]``).

    The attempt capability's reading, closer to V8 than :func:`parse_timestamp_ms`: it
    takes extended years, ``T24:00``, day 31 of any month and a zone-less time as UTC.
    Deliberately narrower than V8's ``Date.parse``, which also guesses at free-form
    dates: anything outside the ISO form is refused.
    """
    if not isinstance(value, str):
        return None
    match = _ES_DATE.fullmatch(value)
    if match is None:
        return None
    year_text, month, day, hour, minute, second, fraction, offset = match.groups()
    if year_text == "-000000":
        return None
    year = int(year_text)
    month_n, day_n = int(month or 1), int(day or 1)
    hour_n, minute_n, second_n = int(hour or 0), int(minute or 0), int(second or 0)
    if not (1 <= month_n <= 12 and 1 <= day_n <= 31 and minute_n <= 59 and second_n <= 59):
        return None
    if hour_n > 24 or (hour_n == 24 and (minute_n or second_n or int(fraction or 0))):
        return None
    days = _days_from_civil(year, month_n, 1) + day_n - 1
    millis = int((fraction or "0")[:3].ljust(3, "0"))
    total = ((days * 24 + hour_n) * 60 + minute_n) * 60_000 + second_n * 1000 + millis
    if offset and offset != "Z":
        sign = 1 if offset[0] == "+" else -1
        offset_h, offset_m = int(offset[1:3]), int(offset[4:6])
        if offset_h > 23 or offset_m > 59:
            return None
        total -= sign * (offset_h * 60 + offset_m) * 60_000
    return total if abs(total) <= 8.64e15 else None


def is_js_date(value: object) -> bool:
    """``Number.isFinite(Date.parse(value))`` for the ECMAScript date-time string format."""
    return parse_js_date_ms(value) is not None


_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def safe_diagnostic(value: str) -> str:
    """The seed's ``safeDiagnostic``: non-printable-ASCII becomes ``?``, cut to 512 characters.

    JavaScript replaces per UTF-16 unit, so a character outside the BMP becomes ``??``;
    after the replacement every character is one unit, so the cut matches ``slice``.
    """
    cleaned = _NOT_PRINTABLE_ASCII.sub(lambda match: "??" if ord(match.group()) > 0xFFFF else "?", value)
    return cleaned[:MAX_DIAGNOSTIC_CHARS]


_FORBIDDEN_COMPONENTS = {"", ".", ".."}


def is_safe_path_component(value: Any) -> bool:
    """Beyond the seed: a session id, generation or token that becomes a path component.

    Refuses empty, ``.``, ``..``, and anything containing ``/`` or NUL.
    """
    return isinstance(value, str) and value not in _FORBIDDEN_COMPONENTS and "/" not in value and "\0" not in value


# --- attrs field validators ------------------------------------------------------------


def require(condition: bool, what: str) -> None:
    """Fail an attrs validator with ``ValueError`` (the record constructors turn it into ``InvalidRecordError``)."""
    if not condition:
        raise ValueError(what)


def validate_non_empty(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(non_empty(value), f"{attribute.name} must be a non-empty string")


def validate_canonical_timestamp(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(is_canonical_utc_timestamp(value), f"{attribute.name} must be a canonical UTC timestamp")


def validate_schema_one(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(is_schema_one(value), f"{attribute.name} must be 1")


def validate_path_component(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(is_safe_path_component(value), f"{attribute.name} must be a safe path component")


FieldValidator = Callable[[object, "attrs.Attribute[Any]", Any], None]


def refuse_unless(check: Callable[[Any], bool]) -> FieldValidator:
    """An attrs validator that raises ``InvalidRecordError(<field name>)`` unless ``check(value)``."""

    def validate(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not check(value):
            raise InvalidRecordError(attribute.name)

    return validate


class _RefusalsAsInvalidRecord:
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


_Record = TypeVar("_Record")


def record_with_exact_keys(record: Callable[..., _Record], value: object, keys: Iterable[str]) -> _Record:
    """``record(**value)`` for a JSON object with exactly ``keys``; anything else, or a refused
    field, is ``InvalidRecordError`` naming the record."""
    name = getattr(record, "__name__", "record")
    if not is_record(value) or not has_exact_keys(value, keys):
        raise InvalidRecordError(name)
    with as_invalid_record(name):
        return record(**value)
