"""Lease fencing, unknown leases, heartbeats and the generic phase path."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from dbutil import count, event_kinds, exactly, lease_phase, query, request_state, scalar, table_dump
from planes import SEAT_PHASES, dispatch_record, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    AdmissionStateError,
    LeaseFence,
    LeaseFenceError,
    LiveTurnCompletion,
    UnknownLeaseError,
)

Operation = Callable[[AdmissionPlane, Any, int], object]

#: Every fenced lease operation, called with (plane, fence, now).
FENCED: dict[str, Operation] = {
    "heartbeat": lambda plane, fence, now: plane.heartbeat(fence, now),
    "mark_starting": lambda plane, fence, now: plane.mark_starting(fence, now),
    "mark_dispatch_intent": lambda plane, fence, now: plane.mark_dispatch_intent(fence, now),
    "mark_active": lambda plane, fence, now: plane.mark_active(fence, now),
    "mark_dispatch_ambiguous": lambda plane, fence, now: plane.mark_dispatch_ambiguous(fence, now),
    "abandon_before_prompt": lambda plane, fence, now: plane.abandon_before_prompt(fence, now, "cancelled"),
    "mark_execution_recovery_required": lambda plane, fence, now: plane.mark_execution_recovery_required(fence, now),
    "release_exited_recovery_seat": lambda plane, fence, now: plane.release_exited_recovery_seat(fence, now),
    "complete_live_turn": lambda plane, fence, now: plane.complete_live_turn(
        fence, now, LiveTurnCompletion("completed")
    ),
}
#: The phase-checked operations: all but the heartbeat.
PHASE_CHECKED = {name: operation for name, operation in FENCED.items() if name != "heartbeat"}


def wrong_fence(fence: LeaseFence, field: str) -> LeaseFence:
    if field == "generation":
        return attrs.evolve(fence, generation=fence.generation + 1)
    return attrs.evolve(fence, owner_instance_id="someone-else")


# --- fence mismatch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["generation", "owner"])
@pytest.mark.parametrize("operation", FENCED, ids=str)
def test_fenced_operation_with_a_stale_fence_raises_lease_fence_error_and_changes_nothing(
    plane: AdmissionPlane, database_url: str, operation: str, field: str
) -> None:
    """Every fenced operation given the right lease id with a wrong generation or owner raises LeaseFenceError and
    writes nothing."""
    lease = lease_in_phase(plane, "admitted")
    before = table_dump(database_url)
    with pytest.raises(LeaseFenceError, match=exactly("lease is not owned by the supplied generation fence")):
        FENCED[operation](plane, wrong_fence(lease.fence, field), 5_000)
    assert table_dump(database_url) == before


@pytest.mark.parametrize("field", ["generation", "owner"])
def test_correct_fence_still_works_after_a_stale_fence_was_refused(
    plane: AdmissionPlane, database_url: str, field: str
) -> None:
    """After a stale fence is refused, the owner's own fence still heartbeats and starts the lease."""
    lease = lease_in_phase(plane, "admitted")
    with pytest.raises(LeaseFenceError):
        plane.mark_starting(wrong_fence(lease.fence, field), 5_000)
    plane.heartbeat(lease, 5_001)
    plane.mark_starting(lease, 5_002)
    assert lease_phase(database_url, lease.lease_id) == "starting"
    assert request_state(database_url, lease.request_id) == "starting"


def test_stale_fence_error_message_does_not_embed_the_lease_id(plane: AdmissionPlane) -> None:
    """The fence error's message does not contain the lease id."""
    lease = lease_in_phase(plane, "admitted")
    with pytest.raises(LeaseFenceError) as raised:
        plane.heartbeat(wrong_fence(lease.fence, "generation"), 5_000)
    assert lease.lease_id not in str(raised.value)


# --- unknown lease --------------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", PHASE_CHECKED, ids=str)
def test_phase_checked_operation_on_a_missing_lease_raises_unknown_lease(
    plane: AdmissionPlane, database_url: str, operation: str
) -> None:
    """Every phase-checked operation on a lease id that does not exist raises `unknown lease` and writes nothing."""
    lease = lease_in_phase(plane, "admitted")
    missing = attrs.evolve(lease.fence, lease_id=str(uuid.uuid4()))
    before = table_dump(database_url)
    with pytest.raises(UnknownLeaseError, match=exactly("unknown lease")) as raised:
        PHASE_CHECKED[operation](plane, missing, 5_000)
    assert isinstance(raised.value, AdmissionStateError)
    assert table_dump(database_url) == before


def test_heartbeat_on_a_missing_lease_raises_lease_fence_error(plane: AdmissionPlane, database_url: str) -> None:
    """A heartbeat on a lease id that does not exist is a LeaseFenceError, not `unknown lease`, and writes nothing."""
    lease = lease_in_phase(plane, "admitted")
    before = table_dump(database_url)
    with pytest.raises(LeaseFenceError):
        plane.heartbeat(attrs.evolve(lease.fence, lease_id=str(uuid.uuid4())), 5_000)
    assert table_dump(database_url) == before


def test_fence_of_a_deleted_lease_is_unknown_to_phase_checked_operations(plane: AdmissionPlane) -> None:
    """Once a lease is abandoned, a phase-checked operation with its old fence raises UnknownLeaseError."""
    lease = lease_in_phase(plane, "admitted")
    plane.abandon_before_prompt(lease, 2_000, "cancelled")
    with pytest.raises(UnknownLeaseError):
        plane.mark_starting(lease, 2_001)


# --- heartbeat ------------------------------------------------------------------------------------------


def test_heartbeat_refreshes_heartbeat_and_clears_suspicion(plane: AdmissionPlane, database_url: str) -> None:
    """A heartbeat sets heartbeat_at to now and clears suspect_since and suspect_reason."""
    lease = lease_in_phase(plane, "active")
    assert plane.mark_suspect(lease.fence, 9_000, "heartbeat_expired")
    assert query(database_url, "SELECT suspect_since, suspect_reason FROM leases") == [(9_000, "heartbeat_expired")]
    plane.heartbeat(lease, 9_500)
    assert query(database_url, "SELECT heartbeat_at, suspect_since, suspect_reason FROM leases") == [
        (9_500, None, None)
    ]


def test_heartbeat_writes_no_event(plane: AdmissionPlane, database_url: str) -> None:
    """A heartbeat is not journalled."""
    lease = lease_in_phase(plane, "active")
    before = event_kinds(database_url)
    plane.heartbeat(lease, 9_500)
    assert event_kinds(database_url) == before


@pytest.mark.parametrize("phase", SEAT_PHASES)
def test_heartbeat_is_accepted_in_every_seat_phase(plane: AdmissionPlane, database_url: str, phase: str) -> None:
    """A heartbeat is accepted in every seat phase and leaves the phase unchanged."""
    lease = lease_in_phase(plane, phase)
    plane.heartbeat(lease, 9_500)
    assert query(database_url, "SELECT phase, heartbeat_at FROM leases") == [(phase, 9_500)]


def test_heartbeat_is_visible_in_the_recovery_inventory(plane: AdmissionPlane) -> None:
    """A later read of the recoverable dispatches shows the newer heartbeat."""
    lease = lease_in_phase(plane, "active")
    before = plane.list_recoverable_dispatches()[0].heartbeat_at
    plane.heartbeat(lease, before + 1_234)
    assert plane.list_recoverable_dispatches()[0].heartbeat_at == before + 1_234


# --- phase guards on the generic path ------------------------------------------------------------------

GUARDS = [
    # (operation, phase the lease is in, message)
    ("mark_starting", "starting", "lease is not admitted"),
    ("mark_dispatch_intent", "admitted", "lease is not starting"),
    ("mark_dispatch_intent", "dispatch_intent", "lease is not starting"),
    ("mark_active", "starting", "lease is not dispatch_intent"),
    ("mark_active", "active", "lease is not dispatch_intent"),
    ("mark_dispatch_ambiguous", "admitted", "lease is not dispatch_intent"),
    ("mark_dispatch_ambiguous", "active", "lease is not dispatch_intent"),
]


@pytest.mark.parametrize(("operation", "phase", "message"), GUARDS)
def test_generic_transition_from_the_wrong_phase_is_refused_with_the_seed_message(
    plane: AdmissionPlane, database_url: str, operation: str, phase: str, message: str
) -> None:
    """Each phase transition from the wrong phase is refused with a message naming the phase it needs, writing
    nothing."""
    lease = lease_in_phase(plane, phase)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly(message)):
        FENCED[operation](plane, lease, 9_000)
    assert table_dump(database_url) == before


TRANSITIONS = [
    # (operation, from phase, to phase, event kind)
    ("mark_starting", "admitted", "starting", "request_starting"),
    ("mark_dispatch_intent", "starting", "dispatch_intent", "request_dispatch_intent"),
    ("mark_active", "dispatch_intent", "active", "request_active"),
    ("mark_dispatch_ambiguous", "dispatch_intent", "dispatch_ambiguous", "request_dispatch_ambiguous"),
]


@pytest.mark.parametrize(("operation", "source", "target", "kind"), TRANSITIONS)
def test_generic_transition_moves_lease_and_request_together_and_journals_it(
    plane: AdmissionPlane, database_url: str, operation: str, source: str, target: str, kind: str
) -> None:
    """A phase transition moves the lease phase and the request state together, stamps heartbeat_at, and journals one
    event."""
    lease = lease_in_phase(plane, source)
    before = len(event_kinds(database_url))
    FENCED[operation](plane, lease, 9_000)
    assert query(database_url, "SELECT phase, heartbeat_at FROM leases") == [(target, 9_000)]
    assert request_state(database_url, lease.request_id) == target
    assert query(
        database_url, "SELECT kind, from_state, to_state, occurred_at FROM events WHERE event_seq > ?", (before,)
    ) == [(kind, source, target, 9_000)]


def test_mark_active_deletes_the_payload(plane: AdmissionPlane, database_url: str) -> None:
    """mark_active deletes the payload, so no recovery path can replay the prompt."""
    lease = lease_in_phase(plane, "dispatch_intent")
    assert count(database_url, "turn_payloads") == 1
    plane.mark_active(lease, 9_000)
    assert count(database_url, "turn_payloads") == 0


def test_mark_dispatch_intent_records_no_process_identity(plane: AdmissionPlane, database_url: str) -> None:
    """mark_dispatch_intent reaches dispatch_intent without writing a process identity row."""
    lease = lease_in_phase(plane, "starting")
    plane.mark_dispatch_intent(lease, 9_000)
    assert count(database_url, "lease_process_identities") == 0
    assert plane.list_recoverable_dispatches()[0].process_identity is None


# --- dispatch_ambiguous is capacity debt ----------------------------------------------------------------


def test_dispatch_ambiguous_keeps_lease_and_identity(one_seat: AdmissionPlane, database_url: str) -> None:
    """After mark_dispatch_ambiguous the request is dispatch_ambiguous and the lease and its pty identity row stay."""
    lease = lease_in_phase(one_seat, "dispatch_intent", prompt_channel="pty")
    one_seat.mark_dispatch_ambiguous(lease, 9_000)
    assert request_state(database_url, lease.request_id) == "dispatch_ambiguous"
    assert count(database_url, "leases") == 1
    assert query(database_url, "SELECT prompt_channel FROM lease_process_identities") == [("pty",)]


def test_dispatch_ambiguous_holds_the_only_seat(one_seat: AdmissionPlane, database_url: str) -> None:
    """In a one-seat pool an ambiguous dispatch keeps every other queued request out."""
    lease = lease_in_phase(one_seat, "dispatch_ambiguous")
    enqueue(one_seat, "r2", agent_id="agent-b", now=2_000)
    assert one_seat.admit_next(100_000, one_seat.owner_identity.owner_instance_id) is None
    assert request_state(database_url, "r2") == "queued"
    assert lease_phase(database_url, lease.lease_id) == "dispatch_ambiguous"


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        ("mark_starting", "lease is not admitted"),
        ("mark_dispatch_intent", "lease is not starting"),
        ("mark_active", "lease is not dispatch_intent"),
        ("abandon_before_prompt", "lease is not safely abandonable before prompt write"),
        ("complete_live_turn", "lease is not active"),
    ],
)
def test_dispatch_ambiguous_has_no_way_back(
    one_seat: AdmissionPlane, database_url: str, operation: str, message: str
) -> None:
    """No lease operation moves an ambiguous dispatch back towards a replay or a clean finish."""
    lease = lease_in_phase(one_seat, "dispatch_ambiguous")
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly(message)):
        FENCED[operation](one_seat, lease, 9_000)
    assert table_dump(database_url) == before


def test_dispatch_ambiguous_cannot_record_a_new_dispatch_intent(one_seat: AdmissionPlane, database_url: str) -> None:
    """commit_dispatch_intent for an ambiguous dispatch reports stale_lease and writes nothing."""
    lease = lease_in_phase(one_seat, "dispatch_ambiguous")
    before = table_dump(database_url)
    result = one_seat.commit_dispatch_intent(dispatch_record(one_seat, lease, prompt_channel="pty"))
    assert (result.status, result.reason) == ("not_committed", "stale_lease")
    assert table_dump(database_url) == before


def test_dispatch_ambiguous_request_never_returns_to_the_queue(one_seat: AdmissionPlane, database_url: str) -> None:
    """After its seat is released an ambiguous request is recovery_required and never returns to the queue."""
    lease = lease_in_phase(one_seat, "dispatch_ambiguous")
    one_seat.release_exited_recovery_seat(lease, 9_000)
    assert request_state(database_url, lease.request_id) == "recovery_required"
    assert one_seat.admit_next(9_001, one_seat.owner_identity.owner_instance_id) is None
    assert scalar(database_url, "SELECT COUNT(*) FROM turn_requests WHERE state = 'queued'") == 0
