"""Cooldowns from the provider's own signal: until its stated reset, capped by the policy, only ever extended."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dbutil import query
from planes import lease_in_phase

from admission_plane import AdmissionPlane, LiveTurnCompletion, LiveTurnFailure, Policy, RetryAfter


def capacity(retry_after: RetryAfter | None) -> LiveTurnCompletion:
    return LiveTurnCompletion("failed", LiveTurnFailure("provider_capacity", http_status=429, retry_after=retry_after))


def cooldown(database_url: str) -> list[tuple[int]]:
    return query(database_url, "SELECT not_before FROM cooldowns")


def test_a_capacity_failure_with_a_signal_cools_down_until_the_providers_reset(
    plane: AdmissionPlane, database_url: str
) -> None:
    """With retry-after 5 s at 1000, the key cools down until 6000, not for the policy's fixed 30 s."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, capacity(RetryAfter.seconds(5)))
    assert cooldown(database_url) == [(6_000,)]


def test_an_absolute_reset_time_counts_from_the_completion(plane: AdmissionPlane, database_url: str) -> None:
    """A reset at an absolute time (epoch ms) ends the cooldown at that time."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, capacity(RetryAfter.until(91_000)))
    assert cooldown(database_url) == [(91_000,)]


def test_a_signal_longer_than_the_policy_maximum_is_capped(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """A provider asking for an hour under max_cooldown_ms = 60 s cools the key down for 60 s."""
    plane = make_plane(policy=Policy(3, 1, 0, 1_800_000, 30_000, max_cooldown_ms=60_000))
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, capacity(RetryAfter.seconds(3_600)))
    assert cooldown(database_url) == [(61_000,)]


@pytest.mark.parametrize(("existing", "expected"), [(100_000, 100_000), (2_000, 6_000)])
def test_a_signal_only_ever_extends_a_cooldown(
    plane: AdmissionPlane, database_url: str, existing: int, expected: int
) -> None:
    """A shorter signal never shortens a cooldown already in force; a longer one extends it."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.set_capacity_cooldown("antigravity", "model-test", existing, 500)
    plane.complete_live_turn(lease, 1_000, capacity(RetryAfter.seconds(5)))
    assert cooldown(database_url) == [(expected,)]


def test_without_a_signal_the_fixed_cooldown_applies(plane: AdmissionPlane, database_url: str) -> None:
    """A capacity failure without retry_after cools down for the policy's capacity_cooldown_ms."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, capacity(None))
    assert cooldown(database_url) == [(31_000,)]
