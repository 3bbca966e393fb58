"""The provider-signal parser: real header examples from the providers' public documentation,
and malformed or hostile values, which are refused and never become a huge or negative wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from admission_plane import InvalidInputError, Policy, RetryAfter, retry_after_from_headers
from admission_plane.signals import MAX_SIGNAL_MS, as_retry_after

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z

# Values as the providers document them: RFC 9110 (Retry-After), OpenAI's rate-limit headers
# (x-ratelimit-reset-*, Go durations) and retry-after-ms, Anthropic's anthropic-ratelimit-*-reset
# (RFC 3339 times) and its retry-after in seconds.
DOCUMENTED = [
    ({"Retry-After": "120"}, 120_000),
    ({"retry-after": "0"}, 0),
    ({"Retry-After": "1.5"}, 1_500),
    ({"Retry-After": "Tue, 14 Nov 2023 22:13:40 GMT"}, 20_000),  # NOW is 2023-11-14T22:13:20Z
    ({"retry-after-ms": "250"}, 250),
    ({"retry-after-ms": "250", "retry-after": "9"}, 250),
    ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, 360_000),
    ({"x-ratelimit-reset-tokens": "20ms"}, 20),
    ({"x-ratelimit-reset-requests": "1h2m3.5s"}, 3_723_500),
    ({"x-ratelimit-reset-requests": "17.052s"}, 17_052),
    ({"anthropic-ratelimit-requests-reset": "2023-11-14T22:13:50Z"}, 30_000),
    (
        {
            "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:30Z",
            "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:14:20+00:00",
        },
        60_000,
    ),
    ({"anthropic-ratelimit-requests-reset": "2020-01-01T00:00:00Z"}, 0),
    ({"content-type": "application/json"}, None),
]


@pytest.mark.parametrize(("headers", "delay"), DOCUMENTED)
def test_documented_headers_give_the_provider_delay(headers: dict[str, str], delay: int | None) -> None:
    """Each documented spelling of "come back later" becomes that delay at the time of the response."""
    signal = retry_after_from_headers(headers)
    if delay is None:
        assert signal is None
        return
    assert signal is not None
    assert signal.delay_ms(NOW) == delay


HOSTILE = [
    {"retry-after": "-1"},
    {"retry-after": "NaN"},
    {"retry-after": "inf"},
    {"retry-after": "1e309"},
    {"retry-after": "99999999999"},
    {"retry-after": "9" * 1_000},
    {"retry-after": ""},
    {"retry-after": "soon"},
    {"retry-after": "１２０"},
    {"retry-after-ms": "-5"},
    {"retry-after-ms": "0x10"},
    {"x-ratelimit-reset-tokens": "1h1h"},
    {"x-ratelimit-reset-tokens": "-1s"},
    {"x-ratelimit-reset-tokens": "999999h"},
    {"anthropic-ratelimit-tokens-reset": "tomorrow"},
    {"anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:50"},
    {"anthropic-ratelimit-tokens-reset": "1969-12-31T23:59:59Z"},
]


@pytest.mark.parametrize("headers", HOSTILE, ids=lambda headers: repr(headers)[:40])
def test_malformed_and_hostile_headers_are_refused(headers: dict[str, str]) -> None:
    """A malformed, negative, non-finite or absurd value raises InvalidInputError instead of becoming a wait."""
    with pytest.raises(InvalidInputError):
        retry_after_from_headers(headers)


@given(st.dictionaries(st.sampled_from(["retry-after", "retry-after-ms", "x-ratelimit-reset-tokens",
                                        "anthropic-ratelimit-requests-reset"]), st.text(max_size=80)))  # fmt: skip
def test_any_header_value_is_refused_or_a_bounded_wait(headers: dict[str, str]) -> None:
    """Whatever the header text, the parser refuses it or yields a wait from 0 to a week, never more, never negative."""
    try:
        signal = retry_after_from_headers(headers)
    except InvalidInputError:
        return
    if signal is not None:
        assert 0 <= signal.delay_ms(NOW) <= MAX_SIGNAL_MS


def test_fail_arguments_accept_seconds_timedeltas_times_values_and_headers() -> None:
    """``fail(retry_after=...)`` takes seconds, a timedelta, an aware datetime, a Retry-After value or headers."""
    moment = datetime.fromtimestamp((NOW + 5_000) / 1000, tz=UTC)
    assert as_retry_after(2).delay_ms(NOW) == 2_000  # type: ignore[union-attr]
    assert as_retry_after(timedelta(milliseconds=750)).delay_ms(NOW) == 750  # type: ignore[union-attr]
    assert as_retry_after(moment).delay_ms(NOW) == 5_000  # type: ignore[union-attr]
    assert as_retry_after("3").delay_ms(NOW) == 3_000  # type: ignore[union-attr]
    assert as_retry_after({"retry-after-ms": "10"}).delay_ms(NOW) == 10  # type: ignore[union-attr]
    assert as_retry_after(None) is None
    for bad in (True, -1, float("nan"), datetime(2030, 1, 1), object()):
        with pytest.raises(InvalidInputError):
            as_retry_after(bad)  # type: ignore[arg-type]


def test_a_past_time_means_now_and_a_delay_is_kept_as_given() -> None:
    """A reset time already passed is a wait of zero; a delay does not depend on the time it is read."""
    assert RetryAfter.until(NOW - 1).delay_ms(NOW) == 0
    assert RetryAfter.seconds(1).delay_ms(0) == RetryAfter.seconds(1).delay_ms(NOW) == 1_000


def test_the_policy_caps_a_signal_and_falls_back_to_its_fixed_cooldown() -> None:
    """The cooldown is the signal capped by max_cooldown_ms, or capacity_cooldown_ms without a signal."""
    policy = Policy(capacity_cooldown_ms=30_000, max_cooldown_ms=60_000)
    assert policy.capacity_cooldown_for(None) == 30_000
    assert policy.capacity_cooldown_for(5_000) == 5_000
    assert policy.capacity_cooldown_for(3_600_000) == 60_000


def test_a_turn_block_fails_with_the_providers_headers() -> None:
    """``turn.fail("provider_capacity", retry_after=headers)`` completes failed with the parsed signal."""
    from admission_plane.turns._decisions import TurnDecisions

    decisions = TurnDecisions()
    decisions.fail("provider_capacity", http_status=429, retry_after={"Retry-After": "7"})
    failure = decisions._completion.failure
    assert failure is not None
    assert failure.retry_after == RetryAfter(wait_ms=7_000)
    with pytest.raises(InvalidInputError):
        decisions.fail("provider_capacity", retry_after={"Retry-After": "-7"})
