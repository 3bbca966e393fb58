"""Seats and start limits: the seat cap, what holds a seat, the start window, mark_starting's guards
and bookkeeping, and the durable seat count."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dbutil import (
    count,
    event_kinds,
    exactly,
    journal_fault,
    query,
    request_state,
    table_dump,
)
from planes import PlaneFactory, activate, admit, dispatch_record, enqueue

from admission_plane import AdmissionDatabaseError, AdmissionPlane, AdmissionStateError, AdmittedLease, Policy
from admission_plane.values import LiveTurnCompletion

TIMEOUT = 1_800_000
OWNER = "owner-a"


def policy(seats: int, starts: int, interval: int) -> Policy:
    return Policy(seats, starts, interval, TIMEOUT, 30_000)


def phase_of(path: str, lease: AdmittedLease) -> str:
    return query(path, "SELECT phase FROM leases WHERE lease_id = ?", (lease.lease_id,))[0][0]


def to_starting(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    plane.mark_starting(lease, 11)


def to_dispatch_intent(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_starting(plane, lease)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok


def to_dispatch_ambiguous(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_dispatch_intent(plane, lease)
    plane.mark_dispatch_ambiguous(lease, 13)


def to_active(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_dispatch_intent(plane, lease)
    plane.mark_active(lease, 13)


def to_recovery_required(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_dispatch_intent(plane, lease)
    plane.mark_execution_recovery_required(lease, 13)


SEAT_PHASES: dict[str, Callable[[AdmissionPlane, AdmittedLease], None]] = {
    "admitted": lambda plane, lease: None,
    "starting": to_starting,
    "dispatch_intent": to_dispatch_intent,
    "dispatch_ambiguous": to_dispatch_ambiguous,
    "active": to_active,
    "recovery_required": to_recovery_required,
}


# --- the seat cap ---------------------------------------------------------------------------------------


def test_fourth_request_waits_while_three_turns_are_active(plane: AdmissionPlane, database_url: str) -> None:
    """With all three seats active, admit_next returns None for a fourth request, which stays queued."""
    for step in range(3):
        enqueue(plane, f"active-{step}", f"agent-{step}", now=step * 10)
        activate(plane, admit(plane, step * 10), step * 10)
    enqueue(plane, "fourth", "agent-4", now=100)
    assert plane.admit_next(200, OWNER) is None
    assert request_state(database_url, "fourth") == "queued"
    assert count(database_url, "leases") == 3


# --- what occupies a seat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", SEAT_PHASES)
def test_every_seat_phase_occupies_a_seat(make_plane: PlaneFactory, database_url: str, phase: str) -> None:
    """A lease in any seat phase, dispatch_ambiguous and recovery_required included, fills a one-seat pool."""
    plane = make_plane(policy=policy(1, 8, 0))
    enqueue(plane, "holder", now=0)
    lease = admit(plane, 10)
    SEAT_PHASES[phase](plane, lease)
    assert phase_of(database_url, lease) == phase
    enqueue(plane, "waiting", "agent-b", now=20)
    before = table_dump(database_url)
    assert plane.admit_next(100, OWNER) is None
    assert table_dump(database_url) == before


def complete(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_active(plane, lease)
    plane.complete_live_turn(lease, 50, LiveTurnCompletion("completed"))


def abandon(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    plane.abandon_before_prompt(lease, 50, "failed")


def release_seat(plane: AdmissionPlane, lease: AdmittedLease) -> None:
    to_recovery_required(plane, lease)
    plane.release_exited_recovery_seat(lease, 50)


SEAT_RELEASES: dict[str, Callable[[AdmissionPlane, AdmittedLease], None]] = {
    "complete_live_turn": complete,
    "abandon_before_prompt": abandon,
    "release_exited_recovery_seat": release_seat,
}


@pytest.mark.parametrize("release", SEAT_RELEASES)
def test_only_deleting_the_lease_frees_the_seat(make_plane: PlaneFactory, database_url: str, release: str) -> None:
    """Live completion, abandonment before the prompt and recovery seat release each delete the lease, after which the
    next request is admitted."""
    plane = make_plane(policy=policy(1, 8, 0))
    enqueue(plane, "holder", now=0)
    lease = admit(plane, 10)
    enqueue(plane, "waiting", "agent-b", now=20)
    SEAT_RELEASES[release](plane, lease)
    assert count(database_url, "leases") == 0
    assert admit(plane, 100).request_id == "waiting"


def test_three_recovery_required_leases_block_a_three_seat_pool_until_released(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Three recovery_required leases hold all three seats until one is released, which lets the waiting request in."""
    plane = make_plane(policy=policy(3, 8, 0))
    leases = []
    for step in range(3):
        enqueue(plane, f"stuck-{step}", f"agent-{step}", now=step)
        leases.append(admit(plane, 10 + step))
    for lease in leases:
        to_recovery_required(plane, lease)
    enqueue(plane, "waiting", "agent-w", now=20)
    assert plane.admit_next(100, OWNER) is None
    plane.release_exited_recovery_seat(leases[0], 110)
    assert admit(plane, 120).request_id == "waiting"
    assert request_state(database_url, "stuck-0") == "recovery_required"


# --- the start window at admission --------------------------------------------------------------------------


def test_admission_waits_one_full_interval_after_the_latest_start(make_plane: PlaneFactory) -> None:
    """With a 100 ms start interval and a start at 1010, the next admission is refused at 1109 and succeeds at 1110."""
    plane = make_plane(policy=policy(2, 2, 100))
    enqueue(plane, "first", "agent-a", now=1_000)
    enqueue(plane, "second", "agent-b", now=1_001)
    plane.mark_starting(admit(plane, 1_002), 1_010)
    assert plane.admit_next(1_109, OWNER) is None
    assert admit(plane, 1_110).request_id == "second"


def test_admission_waits_one_full_interval_after_the_latest_reservation(make_plane: PlaneFactory) -> None:
    """A lease admitted at 1000 and not yet started blocks further admissions for one full start interval."""
    plane = make_plane(policy=policy(3, 3, 100))
    enqueue(plane, "first", "agent-a", now=1_000)
    enqueue(plane, "second", "agent-b", now=1_000)
    admit(plane, 1_000)
    assert plane.admit_next(1_099, OWNER) is None
    assert admit(plane, 1_100).request_id == "second"


def test_start_phase_leases_at_the_concurrent_start_limit_block_admission(
    plane: AdmissionPlane, database_url: str
) -> None:
    """With one concurrent start allowed, an admitted lease blocks the next admission until it becomes active."""
    enqueue(plane, "first", "agent-a", now=0)
    enqueue(plane, "second", "agent-b", now=0)
    lease = admit(plane, 1)
    assert plane.admit_next(2, OWNER) is None
    activate(plane, lease, 2)
    assert admit(plane, 10).request_id == "second"


# --- mark_starting guards -----------------------------------------------------------------------------------


def test_mark_starting_needs_an_admitted_lease(plane: AdmissionPlane, database_url: str) -> None:
    """Starting a lease that has already started raises `lease is not admitted` and changes nothing."""
    enqueue(plane, "started", now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 2)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease is not admitted")):
        plane.mark_starting(lease, 3)
    assert table_dump(database_url) == before


def test_mark_starting_respects_the_concurrent_start_limit(make_plane: PlaneFactory, database_url: str) -> None:
    """When starting leases already reach the calling plane's max_concurrent_starts, mark_starting raises and changes
    nothing."""
    wide = make_plane(policy=policy(3, 2, 0))
    enqueue(wide, "first", "agent-a", now=0)
    enqueue(wide, "second", "agent-b", now=0)
    first, second = admit(wide, 1), admit(wide, 1)
    narrow = make_plane(policy=policy(3, 1, 0))
    narrow.mark_starting(first, 2)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("concurrent start limit reached")):
        narrow.mark_starting(second, 3)
    assert table_dump(database_url) == before


def test_mark_starting_uses_the_calling_planes_start_interval(make_plane: PlaneFactory, database_url: str) -> None:
    """A plane with a 2000 ms start interval refuses to start a lease 500 ms after another start, although the lease was
    admitted under interval 0."""
    loose = make_plane(policy=policy(3, 3, 0))
    enqueue(loose, "first", "agent-a", now=0)
    enqueue(loose, "second", "agent-b", now=0)
    first, second = admit(loose, 1), admit(loose, 1)
    loose.mark_starting(first, 1_000)
    strict = make_plane(policy=policy(3, 3, 2_000))
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("start interval has not elapsed")):
        strict.mark_starting(second, 1_500)
    assert table_dump(database_url) == before


# --- start bookkeeping and atomicity ------------------------------------------------------------------------------


def test_mark_starting_records_history_moves_both_rows_and_journals(plane: AdmissionPlane, database_url: str) -> None:
    """mark_starting adds (lease_id, now) to start_history, moves lease and request to starting with heartbeat now, and
    journals one event."""
    enqueue(plane, "started", now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 25)
    assert query(database_url, "SELECT lease_id, started_at FROM start_history") == [(lease.lease_id, 25)]
    assert query(database_url, "SELECT phase, heartbeat_at, acquired_at FROM leases") == [("starting", 25, 1)]
    assert request_state(database_url, "started") == "starting"
    assert event_kinds(database_url)[-1] == ("request_starting", "admitted", "starting")
    assert query(database_url, "SELECT occurred_at FROM events ORDER BY event_seq DESC LIMIT 1") == [(25,)]


def three_admitted(make_plane: PlaneFactory) -> list[AdmittedLease]:
    loose = make_plane(policy=policy(3, 3, 0))
    for step in range(3):
        enqueue(loose, f"paced-{step}", f"agent-{step}", now=0)
    return [admit(loose, 0) for _ in range(3)]


def test_a_start_exactly_one_interval_later_is_allowed(make_plane: PlaneFactory, database_url: str) -> None:
    """With a 2000 ms start interval, starts at 0 and at 2000 both succeed and both stay in the start history."""
    leases = three_admitted(make_plane)
    paced = make_plane(policy=policy(3, 3, 2_000))
    paced.mark_starting(leases[0], 0)
    paced.mark_starting(leases[1], 2_000)
    assert sorted(row[0] for row in query(database_url, "SELECT started_at FROM start_history")) == [0, 2_000]


def test_mark_starting_prunes_history_strictly_older_than_the_interval(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With a 2000 ms start interval, a start at 4000 deletes the start at 0 and keeps the one at exactly 2000."""
    leases = three_admitted(make_plane)
    paced = make_plane(policy=policy(3, 3, 2_000))
    for lease, now in zip(leases, (0, 2_000, 4_000), strict=True):
        paced.mark_starting(lease, now)
    assert sorted(row[0] for row in query(database_url, "SELECT started_at FROM start_history")) == [2_000, 4_000]


def test_mark_starting_rolls_back_when_its_event_cannot_be_written(plane: AdmissionPlane, database_url: str) -> None:
    """A journal fault during mark_starting leaves lease and request admitted and writes no start_history row."""
    enqueue(plane, "started", now=0)
    lease = admit(plane, 1)
    before = table_dump(database_url)
    with journal_fault(database_url), pytest.raises(AdmissionDatabaseError, match="journal fault injected"):
        plane.mark_starting(lease, 2)
    assert table_dump(database_url) == before
    assert count(database_url, "start_history") == 0


# --- the durable seat count wins ----------------------------------------------------------------------------------


def test_durable_seat_count_overrides_the_in_memory_seats(make_plane: PlaneFactory, database_url: str) -> None:
    """With a claimed one-seat durable policy, a plane configured for three seats admits only one request."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(1, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    enqueue(plane, "first", "agent-a", now=0)
    enqueue(plane, "second", "agent-b", now=0)
    admit(plane, 10)
    assert plane.admit_next(20, OWNER) is None
    assert request_state(database_url, "second") == "queued"


def test_start_limits_come_from_the_planes_own_policy(make_plane: PlaneFactory) -> None:
    """The start limits of the durable policy (1 start per 2000 ms) do not apply, so the plane's own 3 starts per 0 ms
    admit three requests at once."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(3, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    for step in range(3):
        enqueue(plane, f"r-{step}", f"agent-{step}", now=0)
    assert [admit(plane, 5).request_id for _ in range(3)] == ["r-0", "r-1", "r-2"]


def test_no_seat_is_available_while_the_durable_policy_drains(make_plane: PlaneFactory) -> None:
    """No seat is available while the durable policy is draining and a held seat keeps the drain open."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(3, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    enqueue(plane, "holder", "agent-a", now=0)
    enqueue(plane, "waiting", "agent-b", now=0)
    admit(plane, 1)
    plane.begin_soft_drain_to_1(OWNER, 2)
    assert plane.admit_next(3, OWNER) is None
