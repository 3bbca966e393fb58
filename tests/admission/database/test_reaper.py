"""The runtime reaper with injected /proc readers."""

from __future__ import annotations

import errno
from collections.abc import Callable

import attrs
import pytest
from dbutil import count, event_kinds, execute, lease_phase, query, request_state
from fake_proc import OTHER_BOOT, OWNER_B, FakeProc, NoInventoryProc, connector, process
from planes import ONE_SEAT, admit, dispatch_record, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    AdmittedLease,
    InvalidInputError,
    ReaperSummary,
    RecoverableDispatchInventoryError,
)

CONNECTOR = connector(100)
QUEUED_OWNER = connector(300, owner=OWNER_B)
#: A connector that stays alive and enqueues the new work of the seat-freeing tests.
LIVE_OWNER = connector(400, owner=OWNER_B)
#: The clock of the dispatch-intent transaction, so heartbeats stay deterministic.
INTENT_CLOCK = 1_003


def child(n: int = 1):  # type: ignore[no-untyped-def]
    return process(200 + n, ppid=CONNECTOR.process.pid)


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane whose connector identity is the fake pid 100."""
    return make_plane(owner_identity=CONNECTOR, clock=lambda: INTENT_CLOCK)


@pytest.fixture
def one_seat(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    return make_plane(owner_identity=CONNECTOR, clock=lambda: INTENT_CLOCK, policy=ONE_SEAT)


def dispatched(plane: AdmissionPlane, phase: str, n: int = 1, now: int = 1_000, **options: object) -> AdmittedLease:
    """Request ``r<n>`` (agent ``a<n>``) driven to ``phase`` with child ``child(n)``."""
    options.setdefault("child", child(n))
    return lease_in_phase(plane, phase, f"r{n}", now, agent_id=f"a{n}", **options)  # type: ignore[arg-type]


def suspicion(path: str, lease: AdmittedLease) -> tuple[int | None, str | None]:
    (found,) = query(path, "SELECT suspect_since, suspect_reason FROM leases WHERE lease_id = ?", (lease.lease_id,))
    return found


def summary(**counts: int) -> ReaperSummary:
    return ReaperSummary(**counts)


# --- verified exits are released ------------------------------------------------------------------------


@pytest.fixture
def three_recovering(plane: AdmissionPlane) -> list[AdmittedLease]:
    return [dispatched(plane, "recovery_required", n, now=1_000 + 100 * n) for n in (1, 2, 3)]


def test_reaper_releases_every_lease_whose_processes_are_all_gone(
    plane: AdmissionPlane, three_recovering: list[AdmittedLease], database_url: str
) -> None:
    """With every recorded process gone and an empty pid inventory, the reaper releases all three recovery_required
    leases."""
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(inspected=3, released=3)
    assert count(database_url, "leases") == 0


def test_released_requests_stay_recovery_required_without_payload(
    plane: AdmissionPlane, three_recovering: list[AdmittedLease], database_url: str
) -> None:
    """Requests whose seats the reaper released stay recovery_required with no payload and no lease."""
    plane.reap_suspects(2_000, FakeProc(pids=[]))
    assert query(database_url, "SELECT state FROM turn_requests ORDER BY request_id") == [("recovery_required",)] * 3
    assert (count(database_url, "turn_payloads"), count(database_url, "leases")) == (0, 0)


def test_second_reaper_pass_inspects_nothing(plane: AdmissionPlane, three_recovering: list[AdmittedLease]) -> None:
    """After the release a second reaper pass finds no lease to inspect."""
    plane.reap_suspects(2_000, FakeProc(pids=[]))
    assert plane.reap_suspects(2_001, FakeProc(pids=[])) == summary()


def test_fresh_request_is_admitted_after_the_release(
    plane: AdmissionPlane, three_recovering: list[AdmittedLease]
) -> None:
    """Seats the reaper released are given to new requests."""
    enqueue(plane, "r-new", agent_id="a-new", now=1_900, owner_identity=LIVE_OWNER)
    assert plane.admit_next(1_950, CONNECTOR.owner_instance_id) is None
    plane.reap_suspects(2_000, FakeProc(pids=[]).alive(LIVE_OWNER))
    admitted = plane.admit_next(2_001, CONNECTOR.owner_instance_id)
    assert admitted is not None
    assert admitted.request_id == "r-new"


def test_release_is_journalled_from_the_lease_phase(plane: AdmissionPlane, database_url: str) -> None:
    """A crashed active turn is released with an active-to-recovery_required request_recovery_seat_released event."""
    dispatched(plane, "active")
    plane.reap_suspects(2_000, FakeProc(pids=[]))
    assert event_kinds(database_url)[-1] == ("request_recovery_seat_released", "active", "recovery_required")
    assert request_state(database_url, "r1") == "recovery_required"


# --- stale heartbeats -----------------------------------------------------------------------------------


def test_stale_heartbeat_with_live_processes_marks_suspect_and_retains(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A lease whose processes live but whose heartbeat at 1003 is stale at reaper time 10000 stays active and is marked
    suspect heartbeat_expired since 10000."""
    lease = dispatched(plane, "active")
    plane.heartbeat(lease, 1_003)
    readers = FakeProc().alive(CONNECTOR, child())
    assert plane.reap_suspects(10_000, readers) == summary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == "active"
    assert suspicion(database_url, lease) == (10_000, "heartbeat_expired")


@pytest.mark.parametrize(("heartbeat", "marked"), [(5_999, True), (6_000, False), (6_001, False)])
def test_heartbeat_is_stale_only_when_strictly_older_than_4000_ms(
    plane: AdmissionPlane, database_url: str, heartbeat: int, marked: bool
) -> None:
    """At reaper time 10000 only a heartbeat more than 4000 ms old is marked stale, one exactly 4000 ms old is not."""
    lease = dispatched(plane, "active")
    plane.heartbeat(lease, heartbeat)
    result = plane.reap_suspects(10_000, FakeProc().alive(CONNECTOR, child()))
    assert result == summary(inspected=1, retained=1, suspected=int(marked))
    assert suspicion(database_url, lease) == ((10_000, "heartbeat_expired") if marked else (None, None))


def test_threshold_applies_to_each_lease_in_one_pass(plane: AdmissionPlane, database_url: str) -> None:
    """In one pass the staleness threshold applies to each lease on its own: of heartbeats 5999, 6000 and 6001 only the
    first is suspect, and all are retained."""
    leases = []
    for n, heartbeat in zip((1, 2, 3), (5_999, 6_000, 6_001), strict=True):
        lease = dispatched(plane, "active", n, now=1_000 + 100 * n)
        plane.heartbeat(lease, heartbeat)
        leases.append(lease)
    readers = FakeProc().alive(CONNECTOR, child(1), child(2), child(3))
    assert plane.reap_suspects(10_000, readers) == summary(inspected=3, retained=3, suspected=1)
    assert [suspicion(database_url, lease)[0] for lease in leases] == [10_000, None, None]


def test_heartbeat_clears_a_reaper_suspicion(plane: AdmissionPlane, database_url: str) -> None:
    """The owner's next heartbeat clears the suspicion the reaper marked."""
    lease = dispatched(plane, "active")
    plane.reap_suspects(10_000, FakeProc().alive(CONNECTOR, child()))
    plane.heartbeat(lease, 10_001)
    assert suspicion(database_url, lease) == (None, None)


# --- unverifiable evidence ------------------------------------------------------------------------------


def test_unverifiable_child_marks_identity_unverifiable_keeping_the_first_suspect_time(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A stat read failing with an error other than ENOENT retains the lease as identity_unverifiable, keeping the first
    suspect time on later passes."""
    lease = dispatched(plane, "active")
    readers = FakeProc().alive(CONNECTOR).unreadable(child().pid)
    assert plane.reap_suspects(10_000, readers) == summary(inspected=1, retained=1, suspected=2)
    assert suspicion(database_url, lease) == (10_000, "identity_unverifiable")
    plane.reap_suspects(20_000, readers)
    assert suspicion(database_url, lease) == (10_000, "identity_unverifiable")


@pytest.mark.parametrize(
    "make_readers",
    [
        lambda: FakeProc().unreadable(CONNECTOR.process.pid),
        lambda: FakeProc().unreadable(child().pid, errno.EIO),
        lambda: FakeProc(boot_id=PermissionError(errno.EACCES, "denied")),
        lambda: FakeProc(boot_id="not a boot id\n"),
        lambda: FakeProc(pids=[999]).unreadable(999),
        lambda: FakeProc(stats={201: "garbage"}),
    ],
    ids=[
        "connector EACCES",
        "child EIO",
        "boot id unreadable",
        "boot id malformed",
        "residue unreadable",
        "child stat malformed",
    ],
)
def test_unverifiable_evidence_never_releases(
    plane: AdmissionPlane, database_url: str, make_readers: Callable[[], FakeProc]
) -> None:
    """When any piece of evidence cannot be verified the lease is retained as identity_unverifiable."""
    lease = dispatched(plane, "recovery_required")
    result = plane.reap_suspects(2_000, make_readers())
    assert (result.released, result.retained) == (0, 1)
    assert lease_phase(database_url, lease.lease_id) == "recovery_required"
    assert suspicion(database_url, lease) == (2_000, "identity_unverifiable")


# --- missing identity or pid inventory ------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["dispatch_intent", "recovery_required"])
def test_lease_without_identity_is_retained_as_unverifiable(
    plane: AdmissionPlane, database_url: str, phase: str
) -> None:
    """A lease with no identity row, whether dispatched without evidence or blocked before one, is never released and is
    marked identity_unverifiable."""
    if phase == "dispatch_intent":
        lease = dispatched(plane, "dispatch_intent", identity=False)
    else:
        lease = dispatched(plane, "starting")
        plane.mark_execution_recovery_required(lease, 1_010)
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == phase
    assert suspicion(database_url, lease) == (2_000, "identity_unverifiable")


BAD_INVENTORIES: dict[str, Callable[[], object]] = {
    "absent": lambda: NoInventoryProc(),
    "throws": lambda: FakeProc(pids=OSError(errno.EACCES, "denied")),
    "not iterable": lambda: FakeProc(pids=42),
    "an object": lambda: FakeProc(pids=object()),
    "a string": lambda: FakeProc(pids="201 202"),
    "bool pid": lambda: FakeProc(pids=[True]),
    "zero pid": lambda: FakeProc(pids=[0]),
    "negative pid": lambda: FakeProc(pids=[-5]),
    "pid 2^31": lambda: FakeProc(pids=[2**31]),
    "float pid": lambda: FakeProc(pids=[201.0]),
    "text pid": lambda: FakeProc(pids=["201"]),
}


@pytest.mark.parametrize("inventory", BAD_INVENTORIES)
def test_untrustworthy_pid_inventory_retains_every_lease(
    plane: AdmissionPlane, database_url: str, inventory: str
) -> None:
    """A pid inventory that is absent, raises, is not iterable or holds an invalid pid releases nothing."""
    lease = dispatched(plane, "recovery_required")
    assert plane.reap_suspects(2_000, BAD_INVENTORIES[inventory]()) == summary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == "recovery_required"
    assert suspicion(database_url, lease) == (2_000, "identity_unverifiable")


# --- connector gone, child or residue alive -------------------------------------------------------------

CONNECTOR_DEAD_CHILD_ALIVE: dict[str, Callable[[], FakeProc]] = {
    "connector gone, child same": lambda: FakeProc().alive(child()),
    "connector pid reused, child same": lambda: FakeProc().reused(CONNECTOR).alive(child()),
    "connector gone, child gone, residue present": lambda: FakeProc().alive(
        process(777, pgrp=child().pgrp, session=child().session)
    ),
    "connector gone, child reparented": lambda: FakeProc().alive(child(), ppid=1),
}


@pytest.mark.parametrize("evidence", CONNECTOR_DEAD_CHILD_ALIVE)
def test_dead_connector_with_live_child_or_residue_enters_execution_recovery(
    plane: AdmissionPlane, database_url: str, evidence: str
) -> None:
    """When the connector is gone but its dispatch child or group still runs, the reaper moves the lease to
    recovery_required, counts it and retains it."""
    lease = dispatched(plane, "active")
    result = plane.reap_suspects(2_000, CONNECTOR_DEAD_CHILD_ALIVE[evidence]())
    assert result == summary(inspected=1, retained=1, marked_recovery_required=1)
    assert lease_phase(database_url, lease.lease_id) == "recovery_required"
    assert request_state(database_url, "r1") == "recovery_required"


def test_already_recovery_required_lease_is_counted_again_without_an_event(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A lease already recovery_required is counted in marked_recovery_required again, without a new event."""
    dispatched(plane, "recovery_required")
    before = event_kinds(database_url)
    result = plane.reap_suspects(2_000, FakeProc().alive(child()))
    assert result == summary(inspected=1, retained=1, marked_recovery_required=1)
    assert event_kinds(database_url) == before


@pytest.mark.parametrize(
    "make_readers",
    [
        lambda: FakeProc().alive(CONNECTOR),
        lambda: FakeProc().alive(CONNECTOR, child()),
        lambda: FakeProc().alive(CONNECTOR, ppid=4_242),
    ],
    ids=["child gone", "child alive", "connector reparented"],
)
def test_live_connector_is_left_alone(
    plane: AdmissionPlane, database_url: str, make_readers: Callable[[], FakeProc]
) -> None:
    """While the connector is still the same process the lease is only retained, whatever its child does."""
    lease = dispatched(plane, "active")
    before = event_kinds(database_url)
    assert plane.reap_suspects(2_000, make_readers()) == summary(inspected=1, retained=1)
    assert lease_phase(database_url, lease.lease_id) == "active"
    assert event_kinds(database_url) == before


def test_reparented_live_child_keeps_its_seat(plane: AdmissionPlane, database_url: str) -> None:
    """A child reparented after its connector died is still the same process, so its seat is not freed."""
    lease = dispatched(plane, "recovery_required")
    plane.reap_suspects(2_000, FakeProc().alive(child(), ppid=1))
    assert lease_phase(database_url, lease.lease_id) == "recovery_required"
    assert count(database_url, "lease_process_identities") == 1


def test_child_in_a_group_led_from_outside_the_namespace_is_never_released(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A gone child whose recorded process group is 0, led from outside our pid namespace, leaves a group that can never
    be proved empty, so its seat is retained as identity_unverifiable."""
    lease = dispatched(plane, "recovery_required", child=process(201, ppid=CONNECTOR.process.pid, pgrp=0, session=0))
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == "recovery_required"
    assert suspicion(database_url, lease) == (2_000, "identity_unverifiable")


def test_session_zero_child_whose_group_is_gone_is_released(plane: AdmissionPlane, database_url: str) -> None:
    """A child leading its own group in a session led from outside the namespace (session 0) is released once it is
    gone."""
    dispatched(plane, "recovery_required", child=process(201, ppid=CONNECTOR.process.pid, session=0))
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(inspected=1, released=1)
    assert count(database_url, "leases") == 0


def test_evidence_from_a_previous_boot_is_gone(plane: AdmissionPlane, database_url: str) -> None:
    """After a reboot, with another boot id, the recorded processes count as gone even if their pids are in use
    again."""
    dispatched(plane, "recovery_required")
    readers = FakeProc(boot_id=OTHER_BOOT + "\n").alive(
        attrs.evolve(CONNECTOR.process, boot_id=OTHER_BOOT), attrs.evolve(child(), boot_id=OTHER_BOOT)
    )
    assert plane.reap_suspects(2_000, readers) == summary(inspected=1, released=1)
    assert count(database_url, "leases") == 0


# --- queued owners first --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_readers", "settled"),
    [
        (lambda: FakeProc(), True),
        (lambda: FakeProc().reused(QUEUED_OWNER), True),
        (lambda: FakeProc().alive(QUEUED_OWNER), False),
        (lambda: FakeProc().alive(QUEUED_OWNER, ppid=1), False),
        (lambda: FakeProc().unreadable(QUEUED_OWNER.process.pid), False),
    ],
    ids=["gone", "pid reused", "alive", "reparented", "unverifiable"],
)
def test_queued_request_of_a_dead_owner_is_settled(
    plane: AdmissionPlane, database_url: str, make_readers: Callable[[], FakeProc], settled: bool
) -> None:
    """The reaper settles a queued request whose owner is gone or whose pid was reused, but not one whose owner is alive
    or unverifiable."""
    enqueue(plane, "r-q", now=1_000, owner_identity=QUEUED_OWNER)
    assert plane.reap_suspects(2_000, make_readers()) == summary(queued_settled=int(settled))
    assert request_state(database_url, "r-q") == ("cancelled" if settled else "queued")


def test_queued_owners_are_settled_before_dispatches_are_judged(plane: AdmissionPlane, database_url: str) -> None:
    """In one pass the reaper journals the settlement of a dead queued owner before the seat release."""
    dispatched(plane, "recovery_required")
    enqueue(plane, "r-q", now=1_500, owner_identity=QUEUED_OWNER)
    result = plane.reap_suspects(2_000, FakeProc(pids=[]))
    assert result == summary(inspected=1, released=1, queued_settled=1)
    last_two = [kind for kind, _, _ in event_kinds(database_url)[-2:]]
    assert last_two == ["queued_owner_dead", "request_recovery_seat_released"]


# --- summary and inventory corruption -------------------------------------------------------------------


def test_reaper_summary_is_frozen(plane: AdmissionPlane) -> None:
    """The reaper's summary is immutable."""
    result = plane.reap_suspects(2_000, FakeProc())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        result.released = 1  # type: ignore[misc]


def test_summary_counts_a_mixed_pass(plane: AdmissionPlane) -> None:
    """A mixed pass's summary counts the inspected leases and how many were released, retained, marked
    recovery_required, suspected and settled."""
    dispatched(plane, "recovery_required", 1, now=1_000)  # all gone: released
    dispatched(plane, "active", 2, now=1_100)  # connector dead, child alive: recovery_required
    dispatched(plane, "active", 3, now=1_200, identity=False)  # no identity: suspect and retained
    enqueue(plane, "r-q", now=1_300, owner_identity=QUEUED_OWNER)
    result = plane.reap_suspects(2_000, FakeProc().alive(child(2)))
    assert result == summary(
        inspected=3, released=1, retained=2, marked_recovery_required=1, suspected=1, queued_settled=1
    )


@pytest.mark.parametrize(
    "statement",
    ["UPDATE lease_process_identities SET child_pid = 0", "UPDATE turn_requests SET lease_generation = 9"],
)
def test_corrupt_dispatch_row_is_reported_and_never_acted_on(
    plane: AdmissionPlane, database_url: str, statement: str
) -> None:
    """The reaper never acts on a lease row it cannot trust: it counts it untrusted and keeps the lease as it is
    (it no longer raises: one bad row must not stop recovery for every other lease)."""
    dispatched(plane, "recovery_required")
    execute(database_url, statement)
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(untrusted=1)
    assert count(database_url, "leases") == 1
    with pytest.raises(RecoverableDispatchInventoryError):
        plane.list_recoverable_dispatches()


def test_corrupt_queued_owner_row_is_reported_and_every_dispatch_still_judged(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A corrupt queued owner row is counted untrusted and its request left queued; the dispatches are still judged."""
    dispatched(plane, "recovery_required")
    enqueue(plane, "r-q", now=1_500, owner_identity=QUEUED_OWNER)
    execute(database_url, "UPDATE queued_owner_instances SET pid = 0")
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == summary(inspected=1, released=1, untrusted=1)
    assert count(database_url, "leases") == 0
    assert request_state(database_url, "r-q") == "queued"


@pytest.mark.parametrize("now", [-1, True, 1.5, None], ids=repr)
def test_reaper_time_must_be_a_non_negative_safe_integer(plane: AdmissionPlane, now: object) -> None:
    """A reaper time that is not a non-negative safe integer is refused."""
    with pytest.raises(InvalidInputError, match=r"^runtime reaper timestamp must be "):
        plane.reap_suspects(now, FakeProc())  # type: ignore[arg-type]


# --- reaping needs no restart ---------------------------------------------------------------------------


def test_repeated_reaping_frees_seats_for_new_admissions_in_the_same_plane(
    one_seat: AdmissionPlane, database_url: str
) -> None:
    """A plane reaping again and again keeps turning crashed seats into new admissions without a restart."""
    lease = dispatched(one_seat, "active", 1, now=1_000)
    for n in (2, 3, 4):
        t = 1_000 * n
        enqueue(one_seat, f"r{n}", agent_id=f"a{n}", now=t, owner_identity=LIVE_OWNER)
        assert one_seat.admit_next(t + 1, CONNECTOR.owner_instance_id) is None
        one_seat.reap_suspects(t + 2, FakeProc(pids=[]).alive(LIVE_OWNER, child(n - 1)))
        assert lease_phase(database_url, lease.lease_id) == "recovery_required"
        one_seat.reap_suspects(t + 3, FakeProc(pids=[]).alive(LIVE_OWNER))
        assert count(database_url, "leases") == 0
        lease = admit(one_seat, t + 4)
        assert lease.request_id == f"r{n}"
        one_seat.mark_starting(lease, t + 5)
        assert one_seat.commit_dispatch_intent(dispatch_record(one_seat, lease, child=child(n))).ok
        one_seat.mark_active(lease, t + 6)
    assert query(database_url, "SELECT state FROM turn_requests ORDER BY request_id") == [
        ("recovery_required",),
        ("recovery_required",),
        ("recovery_required",),
        ("active",),
    ]
