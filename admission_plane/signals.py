"""Provider signals: when a provider says to come back, as a delay the plane can cool down for.

Providers answer a capacity error (HTTP 429, 503, 529) with the time to wait, in one of a
few spellings. :class:`RetryAfter` holds one such signal; :func:`retry_after_from_headers`
reads it from a response's headers:

* ``retry-after-ms``: milliseconds (OpenAI's and Azure OpenAI's SDKs read it first);
* ``retry-after``: seconds (a non-negative number) or an HTTP date (RFC 9110, section 10.2.3);
* ``x-ratelimit-reset-requests`` / ``x-ratelimit-reset-tokens``: a duration such as ``1s``,
  ``6m0s``, ``20ms`` or ``1h2m3.5s`` (OpenAI, Groq and others);
* ``anthropic-ratelimit-requests-reset``, ``anthropic-ratelimit-tokens-reset``,
  ``anthropic-ratelimit-input-tokens-reset``, ``anthropic-ratelimit-output-tokens-reset``:
  an RFC 3339 time.

:func:`remaining_from_headers` reads what the provider says is left of its current window
(:class:`Remaining`), which corrects the plane's view of a budget downward, never upward
(:meth:`AdmissionPlane.correct_budget <admission_plane.AdmissionPlane.correct_budget>`):

* ``x-ratelimit-remaining-requests`` / ``x-ratelimit-remaining-tokens`` (OpenAI, Groq and others);
* ``anthropic-ratelimit-requests-remaining``, ``anthropic-ratelimit-tokens-remaining``,
  ``anthropic-ratelimit-input-tokens-remaining``, ``anthropic-ratelimit-output-tokens-remaining``
  (the smallest of the token ones is taken).

For the retry signal, the first present header of that list decides (``retry-after-ms`` and ``retry-after`` are the
provider's explicit answer to this very request; the reset headers say when a window
refills, and the latest of them is taken). Header names are matched case-insensitively.
A value that is malformed, negative, not finite or absurd (beyond :data:`MAX_SIGNAL_MS`)
raises :class:`~admission_plane.errors.InvalidInputError`: a hostile or broken header never
becomes a huge or negative cooldown. The plane caps what it accepts by the policy's
``max_cooldown_ms`` in any case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import attrs

from ._validate import is_safe_integer
from .errors import InvalidInputError

__all__ = [
    "MAX_SIGNAL_MS",
    "Remaining",
    "RetryAfter",
    "as_retry_after",
    "remaining_from_headers",
    "retry_after_from_headers",
]

#: The longest wait a signal may name (ms): a week. A coding plan's longest window is days, not months.
MAX_SIGNAL_MS = 7 * 24 * 3_600_000
#: The longest header value read (an HTTP date is 29 characters; RFC 3339 with fractions about 35).
MAX_VALUE_LENGTH = 64

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_DURATION = re.compile(
    r"(?:([0-9]+(?:\.[0-9]+)?)h)?(?:([0-9]+(?:\.[0-9]+)?)m(?!s))?(?:([0-9]+(?:\.[0-9]+)?)s)?(?:([0-9]+(?:\.[0-9]+)?)ms)?"
)
_RESET_HEADERS = ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
_ANTHROPIC_RESET_HEADERS = (
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)


def _wait_ms(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not is_safe_integer(value) or not 0 <= value <= MAX_SIGNAL_MS):
        raise InvalidInputError(f"retry-after {attribute.name} must be an integer from 0 to {MAX_SIGNAL_MS}")


def _at_ms(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not is_safe_integer(value) or value < 0):
        raise InvalidInputError("retry-after time must be a non-negative integer of epoch milliseconds")


@attrs.frozen
class RetryAfter:
    """When the provider said to come back: a delay (``wait_ms``) or a time (``at_ms``, epoch ms).

    Build one with :meth:`seconds`, :meth:`milliseconds`, :meth:`until`, :meth:`http` or
    :func:`retry_after_from_headers`; :meth:`delay_ms` turns it into a delay at a given time.
    """

    wait_ms: int | None = attrs.field(default=None, validator=_wait_ms)
    at_ms: int | None = attrs.field(default=None, validator=_at_ms)

    def __attrs_post_init__(self) -> None:
        if (self.wait_ms is None) == (self.at_ms is None):
            raise InvalidInputError("a retry-after is either a delay or a time")

    @classmethod
    def seconds(cls, value: float) -> RetryAfter:
        """A delay in seconds (fractions allowed)."""
        return cls(wait_ms=_milliseconds(value, 1000, "seconds"))

    @classmethod
    def milliseconds(cls, value: float) -> RetryAfter:
        """A delay in milliseconds."""
        return cls(wait_ms=_milliseconds(value, 1, "milliseconds"))

    @classmethod
    def until(cls, moment: datetime | int) -> RetryAfter:
        """An absolute time: an aware :class:`~datetime.datetime` or epoch milliseconds."""
        if isinstance(moment, datetime):
            if moment.tzinfo is None:
                raise InvalidInputError("retry-after time must be timezone-aware")
            return cls(at_ms=_milliseconds(moment.timestamp(), 1000, "time", limit=None))
        return cls(at_ms=moment)

    @classmethod
    def http(cls, value: str) -> RetryAfter:
        """A ``Retry-After`` header value: delay-seconds or an HTTP date."""
        text = _header_text(value, "retry-after")
        if _NUMBER.fullmatch(text):
            return cls.seconds(float(text))
        try:
            moment = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            raise InvalidInputError("retry-after is neither delay-seconds nor an HTTP date") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # an HTTP date is always GMT
        return cls.until(moment)

    def delay_ms(self, now: int) -> int:
        """The delay at ``now`` (epoch ms): never negative (a time in the past means "now")."""
        if self.wait_ms is not None:
            return self.wait_ms
        assert self.at_ms is not None
        return min(max(0, self.at_ms - now), MAX_SIGNAL_MS)


def as_retry_after(
    value: RetryAfter | float | timedelta | datetime | str | Mapping[str, str] | None,
) -> RetryAfter | None:
    """What a turn's ``fail(..., retry_after=...)`` accepts, as a :class:`RetryAfter`.

    A number is seconds; a :class:`~datetime.timedelta` a delay; an aware
    :class:`~datetime.datetime` a time; a string a ``Retry-After`` header value; a mapping
    the response's headers (``None`` if they carry no signal).
    """
    if value is None or isinstance(value, RetryAfter):
        return value
    if isinstance(value, timedelta):
        return RetryAfter.milliseconds(value.total_seconds() * 1000)
    if isinstance(value, datetime):
        return RetryAfter.until(value)
    if isinstance(value, str):
        return RetryAfter.http(value)
    if isinstance(value, Mapping):
        return retry_after_from_headers(value)
    if isinstance(value, bool):
        raise InvalidInputError("retry_after must be seconds, a timedelta, a datetime, a Retry-After value or headers")
    if isinstance(value, int | float):
        return RetryAfter.seconds(value)
    raise InvalidInputError("retry_after must be seconds, a timedelta, a datetime, a Retry-After value or headers")


def retry_after_from_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> RetryAfter | None:
    """The provider's signal in a response's headers, or ``None`` if it gives none (see the module)."""
    lowered = _lowered(headers)
    if "retry-after-ms" in lowered:
        text = _header_text(lowered["retry-after-ms"], "retry-after-ms")
        if not _NUMBER.fullmatch(text):
            raise InvalidInputError("retry-after-ms is not a number of milliseconds")
        return RetryAfter.milliseconds(float(text))
    if "retry-after" in lowered:
        return RetryAfter.http(lowered["retry-after"])
    durations = [_duration_ms(lowered[name], name) for name in _RESET_HEADERS if name in lowered]
    if durations:
        return RetryAfter(wait_ms=max(durations))
    times = [_rfc3339_ms(lowered[name], name) for name in _ANTHROPIC_RESET_HEADERS if name in lowered]
    if times:
        return RetryAfter(at_ms=max(times))
    return None


_REMAINING_REQUESTS = ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining")
_REMAINING_TOKENS = (
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
)
#: The largest remaining count accepted (a safe integer).
MAX_REMAINING = 2**53 - 1


def _remaining(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not is_safe_integer(value) or value < 0):
        raise InvalidInputError(f"remaining {attribute.name} must be a non-negative integer or None")


@attrs.frozen
class Remaining:
    """What a provider says is left of its current window: ``requests`` and ``tokens`` (``None``: not said)."""

    requests: int | None = attrs.field(default=None, validator=_remaining)
    tokens: int | None = attrs.field(default=None, validator=_remaining)


def remaining_from_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Remaining | None:
    """What is left of the provider's window according to a response's headers, or ``None`` if they do not say.

    Several headers of one kind (Anthropic's tokens, input and output tokens): the smallest
    counts. A malformed value raises :class:`~admission_plane.errors.InvalidInputError`.
    """
    lowered = _lowered(headers)
    requests = [_count(lowered[name], name) for name in _REMAINING_REQUESTS if name in lowered]
    tokens = [_count(lowered[name], name) for name in _REMAINING_TOKENS if name in lowered]
    if not requests and not tokens:
        return None
    return Remaining(min(requests) if requests else None, min(tokens) if tokens else None)


def _lowered(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    lowered: dict[str, str] = {}
    given: object = headers  # checked as given: callers pass what their HTTP client returns
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise InvalidInputError("response headers must be a mapping or (name, value) pairs")
    pairs: Iterable[object] = headers.items() if isinstance(headers, Mapping) else headers
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidInputError("response headers must be a mapping or (name, value) pairs")
        name, value = pair
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidInputError("response headers must be text names and values")
        lowered.setdefault(name.lower(), value)
    return lowered


def _count(value: str, name: str) -> int:
    text = _header_text(value, name)
    if not text.isdigit() or len(text) > 16 or int(text) > MAX_REMAINING:
        raise InvalidInputError(f"{name} is not a non-negative integer")
    return int(text)


def _header_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be text")
    text = value.strip()
    if not text or len(text) > MAX_VALUE_LENGTH or not text.isascii():
        raise InvalidInputError(f"{name} is empty, too long or not ASCII")
    return text


def _milliseconds(value: object, scale: int, label: str, *, limit: int | None = MAX_SIGNAL_MS) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"retry-after {label} must be a finite non-negative number")
    result = math.ceil(value * scale)
    if limit is not None and result > limit:
        raise InvalidInputError(f"retry-after {label} is longer than {limit} ms")
    if not is_safe_integer(result):
        raise InvalidInputError(f"retry-after {label} is out of range")
    return result


def _duration_ms(value: str, name: str) -> int:
    """``1h2m3.5s``, ``6m0s``, ``20ms`` (Go's ``time.Duration`` spelling, as OpenAI sends it)."""
    text = _header_text(value, name)
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        if _NUMBER.fullmatch(text):  # a bare number: seconds
            return _milliseconds(float(text), 1000, name)
        raise InvalidInputError(f"{name} is not a duration such as 1s, 6m0s or 20ms")
    hours, minutes, seconds, millis = (float(part) if part else 0.0 for part in match.groups())
    return _milliseconds(((hours * 60 + minutes) * 60 + seconds) * 1000 + millis, 1, name)


def _rfc3339_ms(value: str, name: str) -> int:
    text = _header_text(value, name)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInputError(f"{name} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise InvalidInputError(f"{name} has no timezone")
    if moment - datetime(1970, 1, 1, tzinfo=UTC) > timedelta(days=365 * 1000):
        raise InvalidInputError(f"{name} is out of range")
    return _milliseconds(moment.timestamp(), 1000, name, limit=None)
