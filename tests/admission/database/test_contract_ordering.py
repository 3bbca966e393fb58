"""Admission ordering: queue order, agent fairness, targeted admission, cooldowns, timeouts, snapshots,
queued cancellation and the shape of an issued lease."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import attrs
import pytest
from dbutil import (
    count,
    event_kinds,
    exactly,
    execute,
    journal_fault,
    query,
    request_state,
    table_dump,
)
from planes import UUID_V4, PlaneFactory, activate, admit, enqueue

from admission_plane import (
    AdmissionDatabaseError,
    AdmissionPlane,
    AdmissionStateError,
    AdmittedLease,
    InvalidInputError,
    Policy,
    QueueSnapshot,
    UnknownRequestError,
)

OWNER = "owner-a"
COOLDOWN_MESSAGE = "capacity cooldown must use integer timestamps and cannot end before it is recorded"
TIMEOUT = 1_800_000


def positions(plane: AdmissionPlane, request_ids: list[str], now: int) -> dict[str, int]:
    snapshots = {request_id: plane.get_queue_snapshot(request_id, now) for request_id in request_ids}
    return {request_id: snapshot.position for request_id, snapshot in snapshots.items() if snapshot is not None}


def lease_count(path: str) -> int:
    return count(path, "leases")


# --- queue order ----------------------------------------------------------------------------------------


def test_queue_is_ordered_by_enqueue_time_then_request_id(plane: AdmissionPlane) -> None:
    """The queue is ordered by enqueue time, then request id, so z at 10 and b and a at 20 stand at positions 1, 3 and
    2."""
    enqueue(plane, "z", now=10)
    enqueue(plane, "b", now=20)
    enqueue(plane, "a", now=20)
    assert positions(plane, ["z", "a", "b"], 30) == {"z": 1, "a": 2, "b": 3}


def test_ties_are_broken_by_binary_request_id(plane: AdmissionPlane) -> None:
    """Request ids compare as bytes, so at the same enqueue time `B` (0x42) stands ahead of `a` (0x61) and is admitted
    first."""
    enqueue(plane, "a", now=20)
    enqueue(plane, "B", now=20)
    assert positions(plane, ["a", "B"], 30) == {"B": 1, "a": 2}
    assert admit(plane, 30).request_id == "B"


def test_admission_follows_queue_order(make_plane: PlaneFactory) -> None:
    """With enough seats and starts, successive admissions follow the queue order."""
    plane = make_plane(policy=Policy(3, 3, 0, TIMEOUT, 30_000))
    enqueue(plane, "z", "agent-z", now=10)
    enqueue(plane, "b", "agent-b", now=20)
    enqueue(plane, "a", "agent-a", now=20)
    assert [admit(plane, 30 + step).request_id for step in range(3)] == ["z", "a", "b"]


# --- agent fairness -----------------------------------------------------------------------------------------


def test_admission_prefers_agent_without_active_lease(plane: AdmissionPlane, database_url: str) -> None:
    """While agent A holds a seat, agent B's newer request is admitted ahead of A's older one, which stays queued."""
    enqueue(plane, "a-1", "agent-a", now=10)
    activate(plane, admit(plane, 10), 10)
    enqueue(plane, "a-2", "agent-a", now=20)
    enqueue(plane, "b-1", "agent-b", now=21)
    assert admit(plane, 30).request_id == "b-1"
    assert request_state(database_url, "a-2") == "queued"


def test_fairness_keeps_fifo_inside_the_idle_agent(plane: AdmissionPlane) -> None:
    """Among the requests of an idle agent, the oldest is admitted first."""
    enqueue(plane, "a-1", "agent-a", now=10)
    activate(plane, admit(plane, 10), 10)
    enqueue(plane, "a-2", "agent-a", now=20)
    enqueue(plane, "b-2", "agent-b", now=22)
    enqueue(plane, "b-1", "agent-b", now=21)
    assert admit(plane, 30).request_id == "b-1"


def test_busy_agent_is_admitted_when_it_is_the_only_one_eligible(plane: AdmissionPlane) -> None:
    """When every eligible request belongs to a busy agent, that agent's oldest request is admitted."""
    enqueue(plane, "a-1", "agent-a", now=10)
    activate(plane, admit(plane, 10), 10)
    enqueue(plane, "a-3", "agent-a", now=21)
    enqueue(plane, "a-2", "agent-a", now=20)
    assert admit(plane, 30).request_id == "a-2"


def test_an_agent_whose_lease_awaits_recovery_still_counts_as_busy(plane: AdmissionPlane) -> None:
    """An agent whose lease is recovery_required still counts as busy, so its older request waits behind another agent's
    newer one."""
    enqueue(plane, "a-1", "agent-a", now=10)
    lease = admit(plane, 10)
    plane.mark_starting(lease, 11)
    plane.mark_execution_recovery_required(lease, 12)
    enqueue(plane, "a-2", "agent-a", now=20)
    enqueue(plane, "b-1", "agent-b", now=21)
    assert admit(plane, 30).request_id == "b-1"


def test_idle_parent_preference_with_two_seats(make_plane: PlaneFactory) -> None:
    """With two seats and requests a-1, a-2 and b-1 in that order, a-1 is admitted first and then b-1, because agent a
    is busy."""
    plane = make_plane(policy=Policy(2, 2, 0, TIMEOUT, 30_000))
    enqueue(plane, "a-1", "agent-a", now=1_000)
    enqueue(plane, "a-2", "agent-a", now=1_001)
    enqueue(plane, "b-1", "agent-b", now=1_002)
    assert [admit(plane, 1_003).request_id, admit(plane, 1_004).request_id] == ["a-1", "b-1"]


# --- targeted admission -----------------------------------------------------------------------------------


def test_targeted_admission_of_the_head_issues_its_lease(plane: AdmissionPlane) -> None:
    """admit_request returns a lease when admit_next would select exactly that request."""
    enqueue(plane, "older", now=10)
    enqueue(plane, "newer", now=20)
    lease = plane.admit_request("older", 30, OWNER)
    assert lease is not None
    assert lease.request_id == "older"


def test_targeted_admission_cannot_jump_the_queue(plane: AdmissionPlane, database_url: str) -> None:
    """admit_request for a request behind the head returns None and changes nothing."""
    enqueue(plane, "older", now=10)
    enqueue(plane, "newer", now=20)
    before = table_dump(database_url)
    assert plane.admit_request("newer", 30, OWNER) is None
    assert table_dump(database_url) == before


def test_targeted_admission_still_sweeps_expired_requests(plane: AdmissionPlane, database_url: str) -> None:
    """admit_request first times out expired requests, which can make its target the new head."""
    enqueue(plane, "expired", now=0)
    enqueue(plane, "target", now=1_000)
    lease = plane.admit_request("target", TIMEOUT, OWNER)
    assert lease is not None
    assert request_state(database_url, "expired") == "queue_timeout"


def test_targeted_admission_of_an_expired_target_times_it_out(plane: AdmissionPlane, database_url: str) -> None:
    """admit_request for an expired target times it out and creates no lease."""
    enqueue(plane, "target", now=0)
    assert plane.admit_request("target", TIMEOUT, OWNER) is None
    assert request_state(database_url, "target") == "queue_timeout"
    assert lease_count(database_url) == 0


def test_targeted_admission_in_cooldown_has_no_side_effects(plane: AdmissionPlane, database_url: str) -> None:
    """admit_request for a target whose provider and model are cooling down returns None and changes nothing."""
    enqueue(plane, "target", now=0)
    plane.set_capacity_cooldown("antigravity", "model-test", 5_000, 0)
    before = table_dump(database_url)
    assert plane.admit_request("target", 10, OWNER) is None
    assert table_dump(database_url) == before


def test_targeted_admission_with_full_seats_has_no_side_effects(make_plane: PlaneFactory, database_url: str) -> None:
    """admit_request with every seat held returns None and changes nothing."""
    plane = make_plane(policy=Policy(1, 1, 0, TIMEOUT, 30_000))
    enqueue(plane, "holder", now=0)
    activate(plane, admit(plane, 0), 0)
    enqueue(plane, "target", now=10)
    before = table_dump(database_url)
    assert plane.admit_request("target", 20, OWNER) is None
    assert table_dump(database_url) == before


def test_targeted_admission_inside_the_start_window_has_no_side_effects(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With a start at 1010 and a 100 ms start interval, admit_request at 1050 returns None and changes nothing."""
    plane = make_plane(policy=Policy(2, 2, 100, TIMEOUT, 30_000))
    enqueue(plane, "first", now=1_000)
    enqueue(plane, "target", now=1_001)
    plane.mark_starting(admit(plane, 1_002), 1_010)
    before = table_dump(database_url)
    assert plane.admit_request("target", 1_050, OWNER) is None
    assert table_dump(database_url) == before


# --- cooldowns -----------------------------------------------------------------------------------------------


def test_cooled_head_is_skipped_for_the_oldest_eligible_request(plane: AdmissionPlane, database_url: str) -> None:
    """A head whose provider and model are cooling down stays queued while the next eligible request is admitted."""
    enqueue(plane, "cooled", now=0)
    enqueue(plane, "ready", now=1, model="other-model")
    plane.set_capacity_cooldown("antigravity", "model-test", 5_000, 0)
    assert admit(plane, 10).request_id == "ready"
    assert request_state(database_url, "cooled") == "queued"


def test_cooldown_blocks_until_not_before_and_releases_at_it(plane: AdmissionPlane) -> None:
    """A cooldown set at 1000 until 31000 blocks admission at 1001 and 30999 and is over at 31000."""
    enqueue(plane, "cooled", now=0)
    plane.set_capacity_cooldown("antigravity", "model-test", 31_000, 1_000)
    assert plane.admit_next(1_001, OWNER) is None
    assert plane.admit_next(30_999, OWNER) is None
    assert admit(plane, 31_000).request_id == "cooled"


def test_cooldown_upsert_never_shortens_or_rewinds(plane: AdmissionPlane, database_url: str) -> None:
    """set_capacity_cooldown keeps the latest not_before and the latest updated_at ever recorded."""
    plane.set_capacity_cooldown("antigravity", "model-test", 31_000, 1_000)
    plane.set_capacity_cooldown("antigravity", "model-test", 10_000, 2_000)
    plane.set_capacity_cooldown("antigravity", "model-test", 40_000, 500)
    assert query(database_url, "SELECT provider, model, not_before, updated_at FROM cooldowns") == [
        ("antigravity", "model-test", 40_000, 2_000)
    ]


@pytest.mark.parametrize(
    ("not_before", "now"),
    [(1.5, 0), (10, 0.5), (float("nan"), 0), (10, None), (9, 10), (True, 0), (2**53, 0)],
    ids=repr,
)
def test_cooldown_inputs_must_be_integers_and_not_end_before_they_are_recorded(
    plane: AdmissionPlane, database_url: str, not_before: object, now: object
) -> None:
    """Non-integer timestamps, or a not_before earlier than now, are refused with the original connector's message and
    write nothing."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(COOLDOWN_MESSAGE)):
        plane.set_capacity_cooldown("antigravity", "model-test", not_before, now)  # type: ignore[arg-type]
    assert table_dump(database_url) == before


def test_cooldown_may_end_when_it_is_recorded(plane: AdmissionPlane, database_url: str) -> None:
    """A cooldown whose not_before equals now, already over, is accepted."""
    plane.set_capacity_cooldown("antigravity", "model-test", 10, 10)
    assert count(database_url, "cooldowns") == 1


# --- queue timeout -----------------------------------------------------------------------------------------

SWEEPERS: dict[str, Callable[[AdmissionPlane, int], object]] = {
    "admit_next": lambda plane, now: plane.admit_next(now, OWNER),
    "admit_request": lambda plane, now: plane.admit_request("late", now, OWNER),
    "get_queue_snapshot": lambda plane, now: plane.get_queue_snapshot("late", now),
}


@pytest.mark.parametrize("sweeper", SWEEPERS)
def test_every_admission_read_first_times_out_expired_requests(
    plane: AdmissionPlane, database_url: str, sweeper: str
) -> None:
    """admit_next, admit_request and get_queue_snapshot each first time out queued requests whose deadline has
    passed."""
    enqueue(plane, "late", now=0)
    assert SWEEPERS[sweeper](plane, 31 * 60_000) is None
    assert query(database_url, "SELECT state, terminal_at FROM turn_requests") == [("queue_timeout", 31 * 60_000)]
    assert count(database_url, "turn_payloads") == 0
    assert query(database_url, "SELECT kind, from_state, to_state, occurred_at FROM events ORDER BY event_seq")[-1] == (
        "request_queue_timed_out",
        "queued",
        "queue_timeout",
        31 * 60_000,
    )


def test_queue_deadline_is_inclusive(plane: AdmissionPlane, database_url: str) -> None:
    """A request is still queued one millisecond before its deadline and times out at the deadline itself."""
    enqueue(plane, "late", now=0)
    assert plane.get_queue_snapshot("late", TIMEOUT - 1) is not None
    assert plane.get_queue_snapshot("late", TIMEOUT) is None
    assert request_state(database_url, "late") == "queue_timeout"


def test_non_runnable_heads_do_not_block_an_eligible_request(make_plane: PlaneFactory, database_url: str) -> None:
    """Timed-out, cancelled and cooling heads are passed over for an eligible request and end queue_timeout, cancelled
    and still queued."""
    plane = make_plane(policy=Policy(3, 1, 0, 100, 30_000))
    enqueue(plane, "timed-out", now=0)
    enqueue(plane, "cancelled", now=10)
    enqueue(plane, "cooled", now=20, model="cool-model")
    enqueue(plane, "ready", now=30)
    plane.cancel_queued("cancelled", 40)
    plane.set_capacity_cooldown("antigravity", "cool-model", 10_000, 40)
    assert admit(plane, 100).request_id == "ready"
    states = dict(query(database_url, "SELECT request_id, state FROM turn_requests"))
    assert states == {"timed-out": "queue_timeout", "cancelled": "cancelled", "cooled": "queued", "ready": "admitted"}
    assert sorted(row[0] for row in query(database_url, "SELECT request_id FROM turn_payloads")) == ["cooled", "ready"]


def test_timeout_sweep_rolls_back_when_its_event_cannot_be_written(plane: AdmissionPlane, database_url: str) -> None:
    """When the timeout event cannot be written, the call raises and the request stays queued with its payload
    readable."""
    enqueue(plane, "late", now=0)
    before = table_dump(database_url)
    with journal_fault(database_url), pytest.raises(AdmissionDatabaseError, match="journal fault injected"):
        plane.admit_next(TIMEOUT, OWNER)
    assert table_dump(database_url) == before
    assert plane.read_payload("late", TIMEOUT - 1) == "prompt for late"


# --- queue snapshot --------------------------------------------------------------------------------------------


def test_snapshot_reports_positions_wait_and_cooldown(plane: AdmissionPlane) -> None:
    """A snapshot reports the queue position, the position among eligible requests, the wait and the cooldown of a
    cooling and a ready request."""
    enqueue(plane, "A", now=1_000, model="cool-model")
    enqueue(plane, "B", now=1_001)
    plane.set_capacity_cooldown("antigravity", "cool-model", 2_000, 1_000)
    assert plane.get_queue_snapshot("A", 1_010) == QueueSnapshot(
        request_id="A", position=1, eligible_position=None, enqueued_at=1_000, waited_ms=10, cooldown_until=2_000
    )
    assert plane.get_queue_snapshot("B", 1_010) == QueueSnapshot(
        request_id="B", position=2, eligible_position=1, enqueued_at=1_001, waited_ms=9, cooldown_until=None
    )


def test_snapshot_wait_is_never_negative(plane: AdmissionPlane) -> None:
    """Asked with a now before the enqueue time, a snapshot reports waited_ms 0."""
    enqueue(plane, "A", now=1_000)
    snapshot = plane.get_queue_snapshot("A", 900)
    assert snapshot is not None
    assert snapshot.waited_ms == 0


def test_snapshot_is_frozen(plane: AdmissionPlane) -> None:
    """A queue snapshot is immutable."""
    enqueue(plane, "A", now=1_000)
    snapshot = plane.get_queue_snapshot("A", 1_010)
    assert snapshot is not None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snapshot.position = 5  # type: ignore[misc]


def test_snapshot_behind_a_held_seat_counts_only_the_queue(make_plane: PlaneFactory) -> None:
    """With the only seat held, a new request's snapshot reports position 1, eligible position 1 and no wait."""
    plane = make_plane(policy=Policy(1, 1, 0, TIMEOUT, 30_000))
    enqueue(plane, "holder", now=0)
    admit(plane, 1)
    enqueue(plane, "waiting", now=5)
    assert plane.get_queue_snapshot("waiting", 5) == QueueSnapshot("waiting", 1, 1, 5, 0, None)


def test_snapshot_is_none_for_unknown_non_queued_or_payload_less_requests(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Unknown, admitted and payload-less requests have no snapshot, and asking changes nothing."""
    enqueue(plane, "admitted", now=0)
    admit(plane, 1)
    plane.enqueue(request_id="bare", session_id="s", agent_id="a", fingerprint="f", provider="p", model="m", now=2)
    before = table_dump(database_url)
    assert [plane.get_queue_snapshot(request_id, 3) for request_id in ("ghost", "admitted", "bare")] == [None] * 3
    assert table_dump(database_url) == before


def test_snapshot_changes_nothing_but_the_sweep(plane: AdmissionPlane, database_url: str) -> None:
    """Reading the snapshot of a queued request leaves the database exactly as it was."""
    enqueue(plane, "A", now=0)
    before = table_dump(database_url)
    assert plane.get_queue_snapshot("A", 10) is not None
    assert table_dump(database_url) == before


# --- cancel while queued ------------------------------------------------------------------------------------


def test_cancel_while_queued_ends_the_request(plane: AdmissionPlane, database_url: str) -> None:
    """cancel_queued sets the request cancelled with terminal_at, deletes its payload and journals request_cancelled."""
    enqueue(plane, "cancelled", now=0)
    plane.cancel_queued("cancelled", 50)
    assert query(database_url, "SELECT state, terminal_at FROM turn_requests") == [("cancelled", 50)]
    assert count(database_url, "turn_payloads") == 0
    assert query(database_url, "SELECT kind, from_state, to_state, occurred_at FROM events ORDER BY event_seq")[-1] == (
        "request_cancelled",
        "queued",
        "cancelled",
        50,
    )


def test_cancelled_request_is_never_admitted(plane: AdmissionPlane) -> None:
    """A cancelled request is admitted neither by admit_next nor by admit_request."""
    enqueue(plane, "cancelled", now=0)
    plane.cancel_queued("cancelled", 1)
    assert plane.admit_next(2, OWNER) is None
    assert plane.admit_request("cancelled", 2, OWNER) is None


def test_cancelling_an_unknown_request_fails(plane: AdmissionPlane, database_url: str) -> None:
    """cancel_queued for an unknown request id raises `unknown request` and writes nothing."""
    before = table_dump(database_url)
    with pytest.raises(UnknownRequestError, match=exactly("unknown request")):
        plane.cancel_queued("ghost", 1)
    assert table_dump(database_url) == before


def test_cancelling_a_request_that_left_the_queue_fails(plane: AdmissionPlane, database_url: str) -> None:
    """cancel_queued for an admitted request raises `request is no longer queued` and changes nothing."""
    enqueue(plane, "admitted", now=0)
    admit(plane, 1)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("request is no longer queued")):
        plane.cancel_queued("admitted", 2)
    assert table_dump(database_url) == before


def test_cancel_then_targeted_admit_leaves_one_terminal_event(make_plane: PlaneFactory, database_url: str) -> None:
    """A targeted admission after a cancel of the same request returns None and leaves no lease, no payload and exactly
    one terminal event."""
    plane = make_plane(policy=Policy(1, 1, 0, TIMEOUT, 30_000))
    enqueue(plane, "holder", now=0)
    activate(plane, admit(plane, 0), 0)
    enqueue(plane, "raced", now=10)
    plane.cancel_queued("raced", 20)
    assert plane.admit_request("raced", 20, OWNER) is None
    assert plane.get_queue_snapshot("raced", 20) is None
    assert count(database_url, "turn_payloads", "request_id = 'raced'") == 0
    assert count(database_url, "leases", "request_id = 'raced'") == 0
    correlation = query(database_url, "SELECT correlation_hmac FROM events ORDER BY event_seq DESC LIMIT 1")[0][0]
    assert query(
        database_url, "SELECT kind, to_state FROM events WHERE correlation_hmac = ? ORDER BY event_seq", (correlation,)
    ) == [("request_enqueued", "queued"), ("request_cancelled", "cancelled")]


# --- the issued lease -------------------------------------------------------------------------------------------


def test_admission_issues_a_frozen_lease_with_a_fresh_uuid4_and_generation_one(plane: AdmissionPlane) -> None:
    """Admission issues a frozen lease with a lowercase canonical UUIDv4 lease id, the request id, generation 1 and the
    given owner."""
    enqueue(plane, "issued", now=0)
    lease = plane.admit_next(7, "any owner id, not a uuid")
    assert lease is not None
    assert re.fullmatch(UUID_V4, lease.lease_id)
    assert str(uuid.UUID(lease.lease_id)) == lease.lease_id
    assert (lease.request_id, lease.generation, lease.owner_instance_id) == ("issued", 1, "any owner id, not a uuid")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        lease.generation = 2  # type: ignore[misc]


def test_admission_writes_the_lease_row_request_state_and_event(plane: AdmissionPlane, database_url: str) -> None:
    """Admission sets the request admitted with its new generation, writes the lease row admitted at now, and journals
    one request_admitted event."""
    enqueue(plane, "issued", now=0)
    lease = admit(plane, 7)
    assert query(database_url, "SELECT state, lease_generation FROM turn_requests") == [("admitted", 1)]
    assert query(
        database_url,
        "SELECT lease_id, request_id, generation, owner_instance_id, phase, acquired_at, heartbeat_at, suspect_since,"
        " suspect_reason FROM leases",
    ) == [(lease.lease_id, "issued", 1, lease.owner_instance_id, "admitted", 7, 7, None, None)]
    assert event_kinds(database_url)[-1] == ("request_admitted", "queued", "admitted")
    assert query(database_url, "SELECT occurred_at FROM events ORDER BY event_seq DESC LIMIT 1") == [(7,)]


def test_generation_is_one_more_than_the_stored_lease_generation(plane: AdmissionPlane, database_url: str) -> None:
    """A lease's generation is one more than the request's stored lease_generation."""
    enqueue(plane, "issued", now=0)
    execute(database_url, "UPDATE turn_requests SET lease_generation = 4")
    assert admit(plane, 1).generation == 5
    assert query(database_url, "SELECT lease_generation FROM turn_requests") == [(5,)]


def test_two_admissions_get_distinct_lease_ids(make_plane: PlaneFactory) -> None:
    """Every admission draws a fresh lease id."""
    plane = make_plane(policy=Policy(3, 3, 0, TIMEOUT, 30_000))
    enqueue(plane, "one", "agent-1", now=0)
    enqueue(plane, "two", "agent-2", now=0)
    assert admit(plane, 1).lease_id != admit(plane, 2).lease_id


@pytest.mark.parametrize("owner", ["", " padded", "line\nbreak", "x" * 257, None, 5], ids=repr)
def test_admission_owner_must_be_a_single_line_identifier(
    plane: AdmissionPlane, database_url: str, owner: object
) -> None:
    """An owner id that is not a single-line identifier is refused by both admission entry points with the original
    connector's message before any write."""
    enqueue(plane, "issued", now=0)
    before = table_dump(database_url)
    message = exactly("admission owner instance ID must be a non-empty single-line identifier")
    with pytest.raises(InvalidInputError, match=message):
        plane.admit_next(1, owner)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=message):
        plane.admit_request("issued", 1, owner)  # type: ignore[arg-type]
    assert table_dump(database_url) == before


@pytest.mark.parametrize("now", [-1, 1.5, float("nan"), True, None, 2**53], ids=repr)
def test_admission_timestamp_must_be_a_non_negative_safe_integer(
    plane: AdmissionPlane, database_url: str, now: object
) -> None:
    """An admission now that is not a non-negative safe integer is refused by both entry points with the original
    connector's message before any write."""
    enqueue(plane, "issued", now=0)
    before = table_dump(database_url)
    message = exactly("admission timestamp must be a non-negative safe integer")
    with pytest.raises(InvalidInputError, match=message):
        plane.admit_next(now, OWNER)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=message):
        plane.admit_request("issued", now, OWNER)  # type: ignore[arg-type]
    assert table_dump(database_url) == before


def test_admitted_lease_exposes_its_fence(plane: AdmissionPlane) -> None:
    """An admitted lease's fence is its lease id, generation and owner instance id."""
    enqueue(plane, "issued", now=0)
    lease: AdmittedLease = admit(plane, 1)
    assert (lease.fence.lease_id, lease.fence.generation, lease.fence.owner_instance_id) == (
        lease.lease_id,
        1,
        lease.owner_instance_id,
    )
