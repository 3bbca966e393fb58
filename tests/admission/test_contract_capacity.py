"""Seats and start limits: the seat cap, what holds a seat, the start window, mark_starting's guards
and bookkeeping, and the durable seat count (AC-39..AC-45)."""

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
from planes import activate, admit, dispatch_record, enqueue

from admission_plane import AdmissionDatabaseError, AdmissionPlane, AdmissionStateError, AdmittedLease, Policy
from admission_plane.values import LiveTurnCompletion

PlaneFactory = Callable[..., AdmissionPlane]
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


# --- AC-39: the seat cap --------------------------------------------------------------------------------


def test_fourth_request_waits_while_three_turns_are_active(plane: AdmissionPlane, database_url: str) -> None:
    """AC-39: with three seats all active, admit_next for a fourth request returns None and it stays queued."""
    for step in range(3):
        enqueue(plane, f"active-{step}", f"agent-{step}", now=step * 10)
        activate(plane, admit(plane, step * 10), step * 10)
    enqueue(plane, "fourth", "agent-4", now=100)
    assert plane.admit_next(200, OWNER) is None
    assert request_state(database_url, "fourth") == "queued"
    assert count(database_url, "leases") == 3


# --- AC-40: what occupies a seat --------------------------------------------------------------------------


@pytest.mark.parametrize("phase", SEAT_PHASES)
def test_every_seat_phase_occupies_a_seat(make_plane: PlaneFactory, database_url: str, phase: str) -> None:
    """AC-40: a lease in any seat phase (dispatch_ambiguous and recovery_required included) fills a one-seat pool."""
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
    """AC-40: completion, pre-prompt abandonment and seat release delete the lease, and the next request is admitted."""
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
    """AC-40: three recovery_required leases hold all three seats; releasing one lets the next request in."""
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


# --- AC-41: the start window at admission -------------------------------------------------------------------


def test_admission_waits_one_full_interval_after_the_latest_start(make_plane: PlaneFactory) -> None:
    """AC-41: 2 seats, 2 starts, 100 ms: admitted at 1002, started at 1010: admission null at 1109, works at 1110."""
    plane = make_plane(policy=policy(2, 2, 100))
    enqueue(plane, "first", "agent-a", now=1_000)
    enqueue(plane, "second", "agent-b", now=1_001)
    plane.mark_starting(admit(plane, 1_002), 1_010)
    assert plane.admit_next(1_109, OWNER) is None
    assert admit(plane, 1_110).request_id == "second"


def test_admission_waits_one_full_interval_after_the_latest_reservation(make_plane: PlaneFactory) -> None:
    """AC-41: a start-phase lease acquired at 1000 blocks admission while acquired_at > now - interval."""
    plane = make_plane(policy=policy(3, 3, 100))
    enqueue(plane, "first", "agent-a", now=1_000)
    enqueue(plane, "second", "agent-b", now=1_000)
    admit(plane, 1_000)
    assert plane.admit_next(1_099, OWNER) is None
    assert admit(plane, 1_100).request_id == "second"


def test_start_phase_leases_at_the_concurrent_start_limit_block_admission(
    plane: AdmissionPlane, database_url: str
) -> None:
    """AC-41: with one concurrent start, an admitted lease blocks the next admission until it becomes active."""
    enqueue(plane, "first", "agent-a", now=0)
    enqueue(plane, "second", "agent-b", now=0)
    lease = admit(plane, 1)
    assert plane.admit_next(2, OWNER) is None
    activate(plane, lease, 2)
    assert admit(plane, 10).request_id == "second"


# --- AC-42: mark_starting guards ----------------------------------------------------------------------------


def test_mark_starting_needs_an_admitted_lease(plane: AdmissionPlane, database_url: str) -> None:
    """AC-42: starting a lease that already started raises `lease is not admitted` and changes nothing."""
    enqueue(plane, "started", now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 2)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease is not admitted")):
        plane.mark_starting(lease, 3)
    assert table_dump(database_url) == before


def test_mark_starting_respects_the_concurrent_start_limit(make_plane: PlaneFactory, database_url: str) -> None:
    """AC-42: with starting leases at the caller's max_concurrent_starts, mark_starting raises and changes nothing."""
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
    """AC-42: a lease admitted under interval 0 but started 500 ms after another start by a 2000 ms plane is refused."""
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


# --- AC-43 / AC-44: start bookkeeping and atomicity ---------------------------------------------------------------


def test_mark_starting_records_history_moves_both_rows_and_journals(plane: AdmissionPlane, database_url: str) -> None:
    """AC-43: start_history gains (lease_id, now), lease and request become starting with heartbeat now, one event."""
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
    """AC-43: with a 2000 ms interval, starts at 0 and 2000 both succeed and history holds both."""
    leases = three_admitted(make_plane)
    paced = make_plane(policy=policy(3, 3, 2_000))
    paced.mark_starting(leases[0], 0)
    paced.mark_starting(leases[1], 2_000)
    assert sorted(row[0] for row in query(database_url, "SELECT started_at FROM start_history")) == [0, 2_000]


def test_mark_starting_prunes_history_strictly_older_than_the_interval(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """AC-43: a start at 4000 deletes history older than 2000 and keeps the start at exactly 2000."""
    leases = three_admitted(make_plane)
    paced = make_plane(policy=policy(3, 3, 2_000))
    for lease, now in zip(leases, (0, 2_000, 4_000), strict=True):
        paced.mark_starting(lease, now)
    assert sorted(row[0] for row in query(database_url, "SELECT started_at FROM start_history")) == [2_000, 4_000]


def test_mark_starting_rolls_back_when_its_event_cannot_be_written(plane: AdmissionPlane, database_url: str) -> None:
    """AC-44: a journal fault during mark_starting leaves lease and request admitted and no start_history row."""
    enqueue(plane, "started", now=0)
    lease = admit(plane, 1)
    before = table_dump(database_url)
    with journal_fault(database_url), pytest.raises(AdmissionDatabaseError, match="journal fault injected"):
        plane.mark_starting(lease, 2)
    assert table_dump(database_url) == before
    assert count(database_url, "start_history") == 0


# --- AC-45: the durable seat count wins ---------------------------------------------------------------------------


def test_durable_seat_count_overrides_the_in_memory_seats(make_plane: PlaneFactory, database_url: str) -> None:
    """AC-45: with a claimed one-seat durable policy, a three-seat plane admits only one request."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(1, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    enqueue(plane, "first", "agent-a", now=0)
    enqueue(plane, "second", "agent-b", now=0)
    admit(plane, 10)
    assert plane.admit_next(20, OWNER) is None
    assert request_state(database_url, "second") == "queued"


def test_start_limits_come_from_the_planes_own_policy(make_plane: PlaneFactory) -> None:
    """AC-45: durable 1 start / 2000 ms does not apply; the plane's own 3 starts / 0 ms admit three at once."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(3, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    for step in range(3):
        enqueue(plane, f"r-{step}", f"agent-{step}", now=0)
    assert [admit(plane, 5).request_id for _ in range(3)] == ["r-0", "r-1", "r-2"]


def test_no_seat_is_available_while_the_durable_policy_drains(make_plane: PlaneFactory) -> None:
    """AC-45: the durable seat count is zero while draining (a held seat keeps the drain open)."""
    plane = make_plane(policy=policy(3, 3, 0))
    plane.claim_durable_policy(Policy(3, 1, 2_000, TIMEOUT, 30_000), OWNER, 0)
    enqueue(plane, "holder", "agent-a", now=0)
    enqueue(plane, "waiting", "agent-b", now=0)
    admit(plane, 1)
    plane.begin_soft_drain_to_1(OWNER, 2)
    assert plane.admit_next(3, OWNER) is None
