"""SIGTERM intents: the durable authorization written before an owner is signalled.

One intent per generation, ever: once ``intent-<G>.json`` or any of its terminal
forms (``.consumed``, ``.cancelled``, ``.expired``, ``.invalidated``) exists, no new
intent can be created for that generation (``owner_intent_replay``).
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any, Final, Literal, Self

import attrs

from ._common import (
    SCHEMA_VERSION,
    InvalidRecordError,
    TmuxOwnerError,
    has_exact_keys,
    is_record,
    js_number,
    require,
    validate_non_empty,
    validate_path_component,
    validate_schema_one,
)
from ._files import ensure_directory, exists_no_follow, lifecycle_paths, publish_exclusive

EXPECTED_TERMINAL_RESULT: Final = "owner_term_then_session_cleanup"
EXPECTED_TERMINAL: Final = {"signal": "SIGTERM", "result": EXPECTED_TERMINAL_RESULT}
INTENT_MARKER_SUFFIXES: Final = (".consumed", ".cancelled", ".expired", ".invalidated")

_INTENT_KEYS = (
    "schema_version",
    "intent_id",
    "state",
    "generation",
    "session_id",
    "server_key",
    "expected_terminal",
    "dispatch_id",
    "created_at",
    "expires_at",
)

_ISO_DATE = re.compile(
    r"(?P<year>[0-9]{4})(?:-(?P<month>[0-9]{2})(?:-(?P<day>[0-9]{2}))?)?"
    r"(?:T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?)?"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2}))?"
)


def _days_from_civil(year: int, month: int, day: int) -> int:
    # Howard Hinnant's algorithm: proleptic Gregorian, valid for year 0 (which datetime cannot hold).
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def parse_timestamp_ms(value: Any) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 UTC-or-offset timestamp, as ``Date.parse`` reads it.

    Accepts every canonical timestamp, date-only forms (UTC), and ``Z``/``+HH:MM``
    offsets. Deliberately stricter than JavaScript: out-of-range fields (``02-29`` in
    a common year, ``T24:00``) and zone-less date-times (local time in JS) are
    refused instead of rolled over or localised. ``None`` means unparseable.
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


def _parsable_timestamp(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    require(isinstance(value, str) and parse_timestamp_ms(value) is not None, f"{attribute.name} must be a timestamp")


def _not_expired_before_created(instance: OwnerIntent, _attribute: object, expires_at: str) -> None:
    created, expires = parse_timestamp_ms(instance.created_at), parse_timestamp_ms(expires_at)
    require(created is not None and expires is not None and created <= expires, "created_at after expires_at")


@attrs.frozen(kw_only=True)
class OwnerIntent:
    """``intent-<G>.json``: a pending authorization to SIGTERM the owner of generation ``G``.

    Beyond the seed: ``generation`` and ``session_id`` must be safe path components.
    """

    intent_id: str = attrs.field(validator=validate_non_empty)
    generation: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    session_id: str = attrs.field(validator=[validate_non_empty, validate_path_component])
    server_key: str = attrs.field(validator=validate_non_empty)
    dispatch_id: str = attrs.field(validator=validate_non_empty)
    created_at: str = attrs.field(validator=_parsable_timestamp)
    expires_at: str = attrs.field(validator=[_parsable_timestamp, _not_expired_before_created])
    state: Literal["pending"] = attrs.field(default="pending", validator=attrs.validators.in_(("pending",)))
    schema_version: int = attrs.field(default=SCHEMA_VERSION, converter=js_number, validator=validate_schema_one)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Accept only the seed's exact pending-intent shape (``isValidOwnerIntent`` without an observation)."""
        if (
            not is_record(value)
            or not has_exact_keys(value, _INTENT_KEYS)
            or not is_record(value["expected_terminal"])
            or value["expected_terminal"] != EXPECTED_TERMINAL
            or not all(isinstance(item, str) for item in value["expected_terminal"].values())
        ):
            raise InvalidRecordError(cls.__name__)
        fields = {key: item for key, item in value.items() if key != "expected_terminal"}
        try:
            return cls(**fields)
        except (TypeError, ValueError) as error:
            raise InvalidRecordError(cls.__name__) from error

    def to_json(self) -> dict[str, Any]:
        """The intent in the seed's key order."""
        return {
            "schema_version": self.schema_version,
            "intent_id": self.intent_id,
            "state": self.state,
            "generation": self.generation,
            "session_id": self.session_id,
            "server_key": self.server_key,
            "expected_terminal": dict(EXPECTED_TERMINAL),
            "dispatch_id": self.dispatch_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }


def create_owner_intent(
    state_dir: str | os.PathLike[str],
    *,
    generation: str,
    session_id: str,
    server_key: str,
    dispatch_id: str,
    created_at: str,
    expires_at: str,
) -> OwnerIntent:
    """Publish the one pending SIGTERM intent of ``generation`` (exclusive create, 0600, fsynced).

    Raises ``owner_intent_invalid`` for an invalid intent (nothing is written) and
    ``owner_intent_replay`` when the generation already has an intent in any state.
    Timestamps are not compared with the clock here.
    """
    try:
        intent = OwnerIntent(
            intent_id=str(uuid.uuid4()),
            generation=generation,
            session_id=session_id,
            server_key=server_key,
            dispatch_id=dispatch_id,
            created_at=created_at,
            expires_at=expires_at,
        )
    except (TypeError, ValueError) as error:
        raise TmuxOwnerError("owner_intent_invalid") from error
    paths = lifecycle_paths(state_dir, session_id, generation)
    ensure_directory(paths.root)
    candidates = [
        paths.intent_file,
        *(paths.intent_file.with_name(paths.intent_file.name + s) for s in INTENT_MARKER_SUFFIXES),
    ]
    if any(exists_no_follow(candidate) for candidate in candidates):
        raise TmuxOwnerError("owner_intent_replay")
    if not publish_exclusive(paths.intent_file, intent.to_json()):
        raise TmuxOwnerError("owner_intent_replay")
    return intent
