"""Timestamps as the seed writes and reads them: ``toISOString``, ``Date.now``, ``Date.parse``.

Three readings coexist, each where the seed uses it: the strict canonical UTC form of
persisted records, the ISO reading of intents and verdicts, and the ECMAScript reading
of the attempt capability's expiry.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_CANONICAL_UTC = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{3}))?Z")
_ISO_DATE = re.compile(
    r"(?P<year>[0-9]{4})(?:-(?P<month>[0-9]{2})(?:-(?P<day>[0-9]{2}))?)?"
    r"(?:T(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})(?::(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?)?"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2}))?"
)
_ES_DATE = re.compile(
    r"([+-][0-9]{6}|[0-9]{4})(?:-([0-9]{2})(?:-([0-9]{2}))?)?"
    r"(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?"
)
# ECMAScript's time value range: +-100,000,000 days around the epoch.
_MAX_TIME_VALUE_MS = 8.64e15


def iso_now(now_ms: int | None = None) -> str:
    """JavaScript's ``new Date().toISOString()``: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    millis = current_ms() if now_ms is None else now_ms
    moment = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def current_ms() -> int:
    """Milliseconds since the epoch, like JavaScript's ``Date.now()``."""
    return time.time_ns() // 1_000_000


def is_canonical_utc_timestamp(value: object) -> bool:
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


def parse_timestamp_ms(value: object) -> int | None:
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
    return total if abs(total) <= _MAX_TIME_VALUE_MS else None


def is_js_date(value: object) -> bool:
    """``Number.isFinite(Date.parse(value))`` for the ECMAScript date-time string format."""
    return parse_js_date_ms(value) is not None


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
