"""Canonical UTC timestamps of persisted records, and the lenient ECMAScript parser of attempt expiries."""

from __future__ import annotations

import pytest

from tmux_owner._timestamps import is_canonical_utc_timestamp, iso_now, parse_js_date_ms

VALID = [
    "2024-02-29T00:00:00Z",  # a leap day
    "2000-02-29T00:00:00.000Z",
    "0000-02-29T00:00:00Z",
    "2026-04-30T23:59:59.999Z",  # the last instant of a 30-day month
    "2026-12-31T23:59:59Z",
    "1970-01-01T00:00:00.000Z",
]
INVALID = [
    "2026-02-29T00:00:00Z",  # no leap day in a common year, nor in a century not divisible by 400
    "1900-02-29T00:00:00Z",
    "2100-02-29T00:00:00Z",
    "2026-04-31T00:00:00Z",  # a day or month out of range
    "2026-00-10T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-01-00T00:00:00Z",
    "2026-01-32T00:00:00Z",
    "2026-01-01T23:59:60Z",  # a leap second, hour 24, minute 60
    "2026-01-01T24:00:00Z",
    "2026-01-01T00:60:00Z",
    "2026-01-01T00:00:00.1Z",  # other spellings
    "2026-01-01T00:00:00.1234Z",
    "2026-01-01T00:00:00z",
    "2026-01-01t00:00:00Z",
    "2026-01-01T00:00:00+00:00",
    "2026-01-01 00:00:00Z",
    "2026-01-01T00:00Z",
    "2026-1-01T00:00:00Z",
    "+02026-01-01T00:00:00Z",
    "2026-01-01T00:00:00Z\n",  # a trailing newline
    "２０２６-01-01T00:00:00Z",  # non-ASCII digits
    "",
]


@pytest.mark.parametrize("value", VALID)
def test_canonical_timestamps_of_real_instants_are_accepted(value: str) -> None:
    """Leap days of leap years (years 0 and 2000 included) and the last instants of months are canonical timestamps."""
    assert is_canonical_utc_timestamp(value)


@pytest.mark.parametrize("value", INVALID)
def test_non_canonical_or_impossible_timestamps_are_refused(value: str) -> None:
    """Leap days of common years, out-of-range fields, other spellings and a trailing newline are not canonical
    timestamps.
    """
    assert not is_canonical_utc_timestamp(value)


@pytest.mark.parametrize("value", [None, 0, 1.5, True, ["2026-01-01T00:00:00Z"]])
def test_non_strings_are_never_timestamps(value: object) -> None:
    """A number, boolean, list or None is never a canonical timestamp."""
    assert not is_canonical_utc_timestamp(value)


@pytest.mark.parametrize("millis", [0, 1, 999, 1_767_225_599_999, 951_782_400_000])
def test_timestamps_the_module_writes_are_javascript_iso_strings(millis: int) -> None:
    """iso_now writes `YYYY-MM-DDTHH:MM:SS.mmmZ`, which is canonical and parses back to the same milliseconds."""
    text = iso_now(millis)
    assert is_canonical_utc_timestamp(text)
    assert len(text) == 24
    assert parse_js_date_ms(text) == millis


@pytest.mark.parametrize(
    ("value", "millis"),
    [
        ("1970-01-01T00:00:00.000Z", 0),
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01", 0),
        ("1970-01-02T00:00:00+01:00", 82_800_000),
        ("1970-01-01T24:00:00Z", 86_400_000),
        ("1970-02-30T00:00:00Z", 5_184_000_000),
    ],
)
def test_attempt_expiry_is_parsed_like_javascript_date_parse_for_iso_strings(value: str, millis: int) -> None:
    """Attempt expiries parse like JavaScript's Date.parse for the ECMAScript ISO forms, rolling over days and honouring
    offsets.
    """
    assert parse_js_date_ms(value) == millis


@pytest.mark.parametrize(
    ("value", "millis"),
    [
        ("-000001-12-31T23:59:59.999Z", -62_167_219_200_001),
        ("-000002-03-01T00:00:00Z", -62_225_193_600_000),
        ("-000400-01-01T00:00:00Z", -74_790_000_000_000),
        ("-271821-04-20T00:00:00Z", -8_640_000_000_000_000),
        ("+275760-09-13T00:00:00Z", 8_640_000_000_000_000),
    ],
)
def test_extended_years_parse_to_the_same_instant_as_javascript(value: str, millis: int) -> None:
    """Extended years, negative ones included, parse to the same instant as V8's Date.parse, up to the edge of the
    ±8.64e15 ms range.
    """
    assert parse_js_date_ms(value) == millis


@pytest.mark.parametrize(
    "value", ["", "soon", "2026-13-01T00:00:00Z", "1970-01-01T24:00:01Z", "-271821-04-19T23:59:59.999Z", 5, None]
)
def test_unparseable_expiry_values_are_refused(value: object) -> None:
    """An expiry that JavaScript's Date.parse cannot read, or that we deliberately refuse, parses to None."""
    assert parse_js_date_ms(value) is None
