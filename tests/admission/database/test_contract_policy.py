"""Durable policy and soft drain."""

from __future__ import annotations

import pytest
from dbutil import count, exactly, query, request_state, table_dump
from planes import CONTENT_KEY, PlaneFactory, activate, admit, enqueue

from admission_plane import (
    AdmissionPlane,
    AdmissionRuntimeError,
    AdmittedLease,
    InvalidInputError,
    LiveTurnCompletion,
    Policy,
)
from admission_plane.crypto import SecretKey, event_correlation, policy_fingerprint

P3 = Policy(3, 1, 2_000, 1_800_000, 30_000)
P1 = Policy(1, 1, 2_000, 1_800_000, 30_000)
P8 = Policy(8, 8, 2_000, 1_800_000, 30_000)
MISMATCH = "admission runtime error: durable policy does not match shared runtime policy"
UNCLAIMED = "admission runtime error: durable policy has not been claimed"
NOT_THREE_SEATS = "admission runtime error: soft drain can only start from a steady three-seat policy"
FINGERPRINT_P3_KEY_2A = "8d5d973734f4523801a9ad7909e374fe12e23bae54b0fc868e0af67e083b672f"
POLICY_STATE_CORRELATION = "7cecbe0bdb5ee1d3972957aa68216f8d3b87221c5ed827d93ca57cf799559d99"
DONE = LiveTurnCompletion("completed")


def fingerprint(policy: Policy, key: bytes = CONTENT_KEY) -> str:
    return policy_fingerprint(SecretKey(key, "content fingerprint"), policy.as_tuple())


def policy_row(path: str) -> list[tuple[object, ...]]:
    return query(
        path,
        "SELECT id, max_active_turns, max_concurrent_starts, min_start_interval_ms, queue_timeout_ms,"
        " capacity_cooldown_ms, drain_state, policy_fingerprint, updated_at, updated_by_owner_instance_id"
        " FROM policy_state",
    )


# --- claim ------------------------------------------------------------------------------------------------------


def test_claim_inserts_the_steady_policy_row(plane: AdmissionPlane, database_url: str) -> None:
    """Claiming a policy inserts row 1 with its five numbers, drain state steady, its fingerprint, the claim time and
    the claiming owner."""
    plane.claim_durable_policy(P3, "owner-a", 1_000)
    assert policy_row(database_url) == [
        (1, 3, 1, 2_000, 1_800_000, 30_000, "steady", fingerprint(P3), 1_000, "owner-a")
    ]


def test_claimed_fingerprint_matches_the_seed_vector(make_plane: PlaneFactory, database_url: str) -> None:
    """Under content key 0x2a x32 the stored fingerprint of policy (3, 1, 2000, 1800000, 30000) is the original
    connector's known value."""
    make_plane(content_fingerprint_key=bytes([0x2A]) * 32).claim_durable_policy(P3, "owner-a", 1_000)
    assert policy_row(database_url)[0][7] == FINGERPRINT_P3_KEY_2A


def test_claiming_the_same_policy_again_is_a_no_op(make_plane: PlaneFactory, database_url: str) -> None:
    """A second claim of the same policy, by another owner and later, changes nothing."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    before = table_dump(database_url)
    make_plane(policy=P1).claim_durable_policy(P3, "owner-b", 5_000)
    assert table_dump(database_url) == before


# --- consistency across openers ------------------------------------------------------------------------------------


def test_matching_policy_assertion_succeeds(make_plane: PlaneFactory) -> None:
    """Another plane with the same policy and content key passes assert_durable_policy_match."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    make_plane(policy=P3).assert_durable_policy_match(P3, "owner-b", 2_000)


def test_mismatched_policy_assertion_raises_the_runtime_error(make_plane: PlaneFactory, database_url: str) -> None:
    """Asserting a one-seat policy against a claimed three-seat policy raises AdmissionRuntimeError with the original
    connector's exact message and writes nothing."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    before = table_dump(database_url)
    with pytest.raises(AdmissionRuntimeError, match=exactly(MISMATCH)):
        make_plane(policy=P1).assert_durable_policy_match(P1, "owner-b", 2_000)
    assert table_dump(database_url) == before


def test_claiming_a_different_policy_over_an_existing_row_raises(make_plane: PlaneFactory, database_url: str) -> None:
    """Claiming a different policy over an existing row raises the same mismatch error and writes nothing."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    before = table_dump(database_url)
    with pytest.raises(AdmissionRuntimeError, match=exactly(MISMATCH)):
        make_plane().claim_durable_policy(P1, "owner-b", 2_000)
    assert table_dump(database_url) == before


def test_match_also_compares_the_fingerprint_so_the_content_key_must_agree(make_plane: PlaneFactory) -> None:
    """The same five policy numbers under another content key do not match the claimed policy."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    with pytest.raises(AdmissionRuntimeError, match=exactly(MISMATCH)):
        make_plane(content_fingerprint_key=bytes([7]) * 32).assert_durable_policy_match(P3, "owner-b", 2_000)


def test_opening_a_plane_with_a_different_in_memory_policy_is_allowed(make_plane: PlaneFactory) -> None:
    """A claimed durable policy does not stop a plane with another in-memory policy from opening."""
    make_plane().claim_durable_policy(P3, "owner-a", 1_000)
    assert make_plane(policy=P8).policy == P8


def test_drain_state_is_not_part_of_the_match(make_plane: PlaneFactory) -> None:
    """While the policy is draining with a seat held, asserting the claimed policy still passes."""
    plane = make_plane()
    plane.claim_durable_policy(P3, "owner-a", 0)
    enqueue(plane, "holder", now=0)
    admit(plane, 1)
    plane.begin_soft_drain_to_1("owner-a", 2)
    plane.assert_durable_policy_match(P3, "owner-a", 3)


# --- unclaimed ----------------------------------------------------------------------------------------------------


def test_assertion_without_a_claimed_policy_raises(plane: AdmissionPlane, database_url: str) -> None:
    """assert_durable_policy_match with no claimed policy raises `durable policy has not been claimed` and writes no
    row."""
    with pytest.raises(AdmissionRuntimeError, match=exactly(UNCLAIMED)):
        plane.assert_durable_policy_match(P3, "owner-a", 0)
    assert policy_row(database_url) == []


def test_soft_drain_without_a_claimed_policy_raises(plane: AdmissionPlane, database_url: str) -> None:
    """begin_soft_drain_to_1 with no claimed policy raises `durable policy has not been claimed` and writes nothing."""
    before = table_dump(database_url)
    with pytest.raises(AdmissionRuntimeError, match=exactly(UNCLAIMED)):
        plane.begin_soft_drain_to_1("owner-a", 0)
    assert table_dump(database_url) == before


# --- durable bounds --------------------------------------------------------------------------------------------------

OUT_OF_DURABLE_BOUNDS = [
    ("min_start_interval_ms", 0, ">= 2000"),
    ("min_start_interval_ms", 1_999, ">= 2000"),
    ("capacity_cooldown_ms", 29_999, ">= 30000"),
    ("queue_timeout_ms", 0, "in 1..1800000"),
    ("queue_timeout_ms", 1_800_001, "in 1..1800000"),
]


@pytest.mark.parametrize(("name", "value", "bound"), OUT_OF_DURABLE_BOUNDS)
def test_claim_refuses_a_policy_outside_the_durable_bounds_before_writing(
    plane: AdmissionPlane, database_url: str, name: str, value: int, bound: str
) -> None:
    """Claiming a policy outside the durable bounds raises an InvalidInputError naming the field and its bound before
    anything is written, instead of letting a table CHECK constraint fail."""
    policy = Policy(
        **{
            **{
                "max_active_turns": 3,
                "max_concurrent_starts": 1,
                "min_start_interval_ms": 2_000,
                "queue_timeout_ms": 1_800_000,
                "capacity_cooldown_ms": 30_000,
            },
            name: value,
        }
    )
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(f"durable admission policy {name} must be {bound}")):
        plane.claim_durable_policy(policy, "owner-a", 0)
    assert table_dump(database_url) == before


@pytest.mark.parametrize("policy", [Policy(1, 1, 2_000, 1, 30_000), Policy(9, 9, 2_000, 1_800_000, 30_000)])
def test_claim_accepts_the_durable_bounds_themselves(plane: AdmissionPlane, database_url: str, policy: Policy) -> None:
    """A policy exactly at the durable bounds (interval 2000, cooldown 30000, queue timeout 1 or 1800000, any seats of
    at least 1) is claimed."""
    plane.claim_durable_policy(policy, "owner-a", 0)
    assert policy_row(database_url)[0][1:6] == policy.as_tuple()


# --- the soft drain lifecycle -----------------------------------------------------------------------------------------


def drain_scenario(make_plane: PlaneFactory) -> tuple[AdmissionPlane, list[AdmittedLease]]:
    """Claimed P3; three active turns; queued four and five; draining since 12 000 (by owner-a)."""
    plane = make_plane(policy=P3)
    plane.claim_durable_policy(P3, "owner-a", 0)
    leases = []
    for step, now in enumerate((1_000, 4_000, 7_000)):
        enqueue(plane, f"turn-{step + 1}", f"agent-{step + 1}", now=now)
        leases.append(admit(plane, now))
        activate(plane, leases[-1], now)
    enqueue(plane, "four", "agent-4", now=10_000)
    enqueue(plane, "five", "agent-5", now=10_001)
    plane.begin_soft_drain_to_1("owner-a", 12_000)
    return plane, leases


def test_beginning_a_drain_marks_the_row_and_keeps_the_leases(make_plane: PlaneFactory, database_url: str) -> None:
    """Beginning a drain keeps 3 seats in the row, marks it soft_draining_to_1 at the drain time by the draining owner,
    and leaves the three active leases alone."""
    drain_scenario(make_plane)
    assert policy_row(database_url) == [
        (1, 3, 1, 2_000, 1_800_000, 30_000, "soft_draining_to_1", fingerprint(P3), 12_000, "owner-a")
    ]
    assert query(database_url, "SELECT phase FROM leases") == [("active",)] * 3


def test_no_admission_while_draining_even_after_two_completions(make_plane: PlaneFactory, database_url: str) -> None:
    """No request is admitted while the policy drains, even after two of the three active turns have completed."""
    plane, leases = drain_scenario(make_plane)
    assert plane.admit_next(12_001, "owner-a") is None
    plane.complete_live_turn(leases[0], 13_100, DONE)
    plane.complete_live_turn(leases[1], 13_200, DONE)
    assert policy_row(database_url)[0][6] == "soft_draining_to_1"
    assert plane.admit_next(13_250, "owner-a") is None
    assert [request_state(database_url, name) for name in ("four", "five")] == ["queued", "queued"]


def test_last_seat_release_completes_the_drain_to_one_seat(make_plane: PlaneFactory, database_url: str) -> None:
    """Completing the last of three turns ends the drain: the row becomes steady with one seat, the one-seat
    fingerprint, that time and the lease's owner."""
    plane, leases = drain_scenario(make_plane)
    for lease, now in zip(leases, (13_100, 13_200, 13_300), strict=True):
        plane.complete_live_turn(lease, now, DONE)
    assert policy_row(database_url) == [
        (1, 1, 1, 2_000, 1_800_000, 30_000, "steady", fingerprint(P1), 13_300, leases[2].owner_instance_id)
    ]


def test_drain_completion_is_journalled_over_policy_state(make_plane: PlaneFactory, database_url: str) -> None:
    """The end of a drain journals one policy_drain_completed event from draining to steady, correlated on
    `policy-state`."""
    plane, leases = drain_scenario(make_plane)
    for lease, now in zip(leases, (13_100, 13_200, 13_300), strict=True):
        plane.complete_live_turn(lease, now, DONE)
    drained = query(
        database_url,
        "SELECT from_state, to_state, occurred_at, correlation_hmac FROM events WHERE kind = 'policy_drain_completed'",
    )
    expected = event_correlation(SecretKey(CONTENT_KEY, "content fingerprint"), "policy-state")
    assert expected == POLICY_STATE_CORRELATION
    assert drained == [("policy_soft_draining_to_1", "policy_steady", 13_300, POLICY_STATE_CORRELATION)]
    assert query(database_url, "SELECT kind FROM events ORDER BY event_seq DESC LIMIT 1") == [
        ("policy_drain_completed",)
    ]


def test_after_the_drain_one_seat_is_shared(make_plane: PlaneFactory, database_url: str) -> None:
    """After the drain a one-seat plane's assertion passes, the next queued request is admitted, and no second one is
    while it holds the seat."""
    plane, leases = drain_scenario(make_plane)
    for lease, now in zip(leases, (13_100, 13_200, 13_300), strict=True):
        plane.complete_live_turn(lease, now, DONE)
    make_plane(policy=P1).assert_durable_policy_match(P1, "owner-b", 14_000)
    four = admit(plane, 16_000)
    assert four.request_id == "four"
    activate(plane, four, 16_000)
    assert plane.admit_next(18_100, "owner-a") is None
    assert request_state(database_url, "five") == "queued"


# --- drain edge cases -------------------------------------------------------------------------------------------


def test_draining_a_steady_one_seat_policy_is_a_no_op(plane: AdmissionPlane, database_url: str) -> None:
    """begin_soft_drain_to_1 on a steady one-seat policy changes nothing."""
    plane.claim_durable_policy(P1, "owner-a", 0)
    before = table_dump(database_url)
    plane.begin_soft_drain_to_1("owner-b", 10)
    assert table_dump(database_url) == before


def test_draining_from_a_non_three_seat_policy_raises(plane: AdmissionPlane, database_url: str) -> None:
    """A steady eight-seat policy refuses to drain with the original connector's exact message and writes nothing."""
    plane.claim_durable_policy(P8, "owner-a", 0)
    before = table_dump(database_url)
    with pytest.raises(AdmissionRuntimeError, match=exactly(NOT_THREE_SEATS)):
        plane.begin_soft_drain_to_1("owner-a", 10)
    assert table_dump(database_url) == before


def test_drain_with_no_seat_held_completes_in_the_same_call(plane: AdmissionPlane, database_url: str) -> None:
    """With no seat held, beginning a drain completes it at once, leaving a steady one-seat row and one event."""
    plane.claim_durable_policy(P3, "owner-a", 0)
    plane.begin_soft_drain_to_1("owner-b", 500)
    assert policy_row(database_url) == [(1, 1, 1, 2_000, 1_800_000, 30_000, "steady", fingerprint(P1), 500, "owner-b")]
    assert query(database_url, "SELECT kind, occurred_at FROM events") == [("policy_drain_completed", 500)]


def test_beginning_a_drain_again_while_seats_are_held_changes_nothing(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Beginning a drain again while already draining with seats held changes nothing."""
    drain_scenario(make_plane)
    before = table_dump(database_url)
    make_plane(policy=P3).begin_soft_drain_to_1("owner-b", 12_500)
    assert table_dump(database_url) == before


def recovery_lease(plane: AdmissionPlane) -> AdmittedLease:
    plane.claim_durable_policy(P3, "owner-a", 0)
    enqueue(plane, "stuck", now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 2)
    plane.begin_soft_drain_to_1("owner-a", 3)
    plane.mark_execution_recovery_required(lease, 4)
    return lease


def test_recovery_required_lease_delays_the_drain(plane: AdmissionPlane, database_url: str) -> None:
    """A lease entering recovery_required keeps its seat, so the drain does not complete."""
    recovery_lease(plane)
    assert policy_row(database_url)[0][6] == "soft_draining_to_1"
    assert count(database_url, "events", "kind = 'policy_drain_completed'") == 0


def test_releasing_the_recovery_seat_completes_the_drain(plane: AdmissionPlane, database_url: str) -> None:
    """release_exited_recovery_seat frees the last seat and so completes the drain."""
    lease = recovery_lease(plane)
    plane.release_exited_recovery_seat(lease, 5)
    assert policy_row(database_url)[0][1:7] == (1, 1, 2_000, 1_800_000, 30_000, "steady")
    assert count(database_url, "events", "kind = 'policy_drain_completed' AND occurred_at = 5") == 1


def test_abandoning_before_the_prompt_completes_the_drain(plane: AdmissionPlane, database_url: str) -> None:
    """abandon_before_prompt frees the last seat and so completes the drain, recorded for the lease's owner."""
    plane.claim_durable_policy(P3, "owner-a", 0)
    enqueue(plane, "abandoned", now=0)
    lease = admit(plane, 1)
    plane.begin_soft_drain_to_1("owner-a", 2)
    plane.abandon_before_prompt(lease, 3, "cancelled")
    assert policy_row(database_url)[0][1:7] == (1, 1, 2_000, 1_800_000, 30_000, "steady")
    assert policy_row(database_url)[0][9] == lease.owner_instance_id
