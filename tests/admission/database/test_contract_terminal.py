"""Terminal paths: live completion, cooldowns, abandonment, execution recovery, seat release."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dbutil import count, event_kinds, exactly, query, request_state, table_dump
from planes import SEAT_PHASES, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    AdmissionStateError,
    AdmittedLease,
    FailureCategory,
    InvalidInputError,
    LeaseFence,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
    UnknownLeaseError,
)

COMPLETED = LiveTurnCompletion("completed")
CAPACITY = LiveTurnCompletion("failed", LiveTurnFailure("provider_capacity", http_status=503, code="overloaded"))
OTHER_CATEGORIES = [category for category in FailureCategory if category is not FailureCategory.PROVIDER_CAPACITY]


def new_events(path: str, after: int) -> list[tuple[str, str, str, int]]:
    return query(
        path,
        "SELECT kind, from_state, to_state, occurred_at FROM events WHERE event_seq > ? ORDER BY event_seq",
        (after,),
    )


def terminal(path: str, request_id: str = "r1") -> tuple[str, int | None]:
    (found,) = query(path, "SELECT state, terminal_at FROM turn_requests WHERE request_id = ?", (request_id,))
    return found


def owner(plane: AdmissionPlane) -> str:
    return plane.owner_identity.owner_instance_id


# --- completion -----------------------------------------------------------------------------------------


def test_completion_journals_provider_terminal_then_released_at_now(plane: AdmissionPlane, database_url: str) -> None:
    """Completing an active turn journals provider_terminal and then a release to completed, both at now."""
    lease = lease_in_phase(plane, "active", now=100)
    after = len(event_kinds(database_url))
    plane.complete_live_turn(lease, 1_000, COMPLETED)
    assert new_events(database_url, after) == [
        ("request_provider_terminal", "active", "provider_terminal", 1_000),
        ("request_released", "provider_terminal", "completed", 1_000),
    ]


def test_completion_ends_the_request_and_deletes_payload_and_lease(plane: AdmissionPlane, database_url: str) -> None:
    """Completion ends the request as completed at now and deletes its payload and lease in the same transaction."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, COMPLETED)
    assert terminal(database_url) == ("completed", 1_000)
    assert (count(database_url, "turn_payloads"), count(database_url, "leases")) == (0, 0)


def test_completion_frees_the_seat_immediately(one_seat: AdmissionPlane) -> None:
    """In a one-seat pool the next request is admitted right after a completion."""
    lease = lease_in_phase(one_seat, "active", now=100)
    enqueue(one_seat, "r2", agent_id="agent-b", now=200)
    assert one_seat.admit_next(999, owner(one_seat)) is None
    one_seat.complete_live_turn(lease, 1_000, COMPLETED)
    admitted = one_seat.admit_next(1_000, owner(one_seat))
    assert admitted is not None
    assert admitted.request_id == "r2"


@pytest.mark.parametrize(
    "phase", ["admitted", "starting", "dispatch_intent", "dispatch_ambiguous", "recovery_required"]
)
def test_completion_requires_an_active_lease(plane: AdmissionPlane, database_url: str, phase: str) -> None:
    """Completing a lease that is not active raises `lease is not active` and writes nothing."""
    lease = lease_in_phase(plane, phase, now=100)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease is not active")):
        plane.complete_live_turn(lease, 1_000, COMPLETED)
    assert table_dump(database_url) == before


# --- capacity failure cooldown --------------------------------------------------------------------------


def test_capacity_failure_fails_the_request_and_starts_a_cooldown(plane: AdmissionPlane, database_url: str) -> None:
    """A provider_capacity failure at 1000 under a 30000 ms cooldown fails the request and cools its provider and model
    down until 31000."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, CAPACITY)
    assert terminal(database_url) == ("failed", 1_000)
    assert count(database_url, "leases") == 0
    assert query(database_url, "SELECT provider, model, not_before, updated_at FROM cooldowns") == [
        ("antigravity", "model-test", 31_000, 1_000)
    ]


def test_capacity_cooldown_length_comes_from_the_planes_policy(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """The cooldown after a capacity failure lasts the completing plane's own capacity_cooldown_ms."""
    plane = make_plane(policy=Policy(3, 1, 0, 1_800_000, 45_000))
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, CAPACITY)
    assert query(database_url, "SELECT not_before FROM cooldowns") == [(46_000,)]


@pytest.mark.parametrize(
    ("existing", "merged"),
    [
        ((50_000, 500), (50_000, 1_000)),
        ((10_000, 900), (31_000, 1_000)),
        ((60_000, 5_000), (60_000, 5_000)),
    ],
    ids=["longer cooldown kept", "shorter cooldown extended", "later update kept"],
)
def test_capacity_cooldown_merges_with_an_existing_row_by_max(
    plane: AdmissionPlane, database_url: str, existing: tuple[int, int], merged: tuple[int, int]
) -> None:
    """A capacity failure merges with an existing cooldown by keeping the later value of each column, never shortening
    it."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.set_capacity_cooldown("antigravity", "model-test", *existing)
    plane.complete_live_turn(lease, 1_000, CAPACITY)
    assert query(database_url, "SELECT not_before, updated_at FROM cooldowns") == [merged]


def test_capacity_cooldown_holds_back_the_same_model_until_it_ends(plane: AdmissionPlane) -> None:
    """After a capacity failure the same provider and model are not admitted before the cooldown ends and are admitted
    when it does."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, CAPACITY)
    enqueue(plane, "r2", agent_id="agent-b", now=1_100)
    assert plane.admit_next(30_999, owner(plane)) is None
    admitted = plane.admit_next(31_000, owner(plane))
    assert admitted is not None
    assert admitted.request_id == "r2"


# --- other failure categories ---------------------------------------------------------------------------


@pytest.mark.parametrize("category", OTHER_CATEGORIES, ids=str)
def test_other_failure_categories_fail_without_a_cooldown(
    plane: AdmissionPlane, database_url: str, category: FailureCategory
) -> None:
    """Failures of any category other than provider_capacity fail the request without a cooldown."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, LiveTurnCompletion("failed", LiveTurnFailure(category, http_status=503)))
    assert terminal(database_url) == ("failed", 1_000)
    assert count(database_url, "cooldowns") == 0


# --- completion validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["queued", "active", "recovery_required", "done", "", None], ids=repr)
def test_completion_outcome_outside_completed_failed_cancelled_is_invalid(outcome: object) -> None:
    """A completion outcome other than completed, failed or cancelled is refused with `live turn completion outcome is
    invalid`."""
    with pytest.raises(InvalidInputError, match=exactly("live turn completion outcome is invalid")):
        LiveTurnCompletion(outcome)  # type: ignore[arg-type]


@pytest.mark.parametrize("outcome", ["completed", "cancelled"])
def test_failure_with_a_non_failed_outcome_is_inconsistent(outcome: str) -> None:
    """A failure attached to a completed or cancelled outcome is refused with `live turn completion failure is
    inconsistent`."""
    with pytest.raises(InvalidInputError, match=exactly("live turn completion failure is inconsistent")):
        LiveTurnCompletion(outcome, LiveTurnFailure("quota"))  # type: ignore[arg-type]


@pytest.mark.parametrize("category", ["overloaded", "PROVIDER_CAPACITY", "", None], ids=repr)
def test_unknown_failure_category_is_invalid(category: object) -> None:
    """An unknown failure category is refused with `live turn failure category is invalid`."""
    with pytest.raises(InvalidInputError, match=exactly("live turn failure category is invalid")):
        LiveTurnFailure(category)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [99, 600, -503, True, 503.5, "503"], ids=repr)
def test_http_status_outside_100_to_599_is_invalid(status: object) -> None:
    """An HTTP status that is not an integer in 100..599 is refused with `live turn failure HTTP status is invalid`."""
    with pytest.raises(InvalidInputError, match=exactly("live turn failure HTTP status is invalid")):
        LiveTurnFailure("transport", http_status=status)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [100, 599])
def test_http_status_bounds_are_accepted(status: int) -> None:
    """HTTP statuses 100 and 599 are accepted."""
    assert LiveTurnFailure("transport", http_status=status).http_status == status


@pytest.mark.parametrize("field", ["code", "reason"])
@pytest.mark.parametrize("signal", ["", " padded", "two\nlines", "nul\x00", "x" * 257, 42], ids=repr)
def test_failure_code_and_reason_must_be_identifiers(field: str, signal: object) -> None:
    """A failure code or reason that is not a non-empty single-line identifier is refused."""
    with pytest.raises(
        InvalidInputError, match=exactly("live turn failure signal must be a non-empty single-line identifier")
    ):
        LiveTurnFailure("unknown", **{field: signal})  # type: ignore[arg-type]


def test_completion_that_is_not_a_completion_value_is_refused_before_any_write(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A completion that is not a LiveTurnCompletion, such as a plain mapping, is refused before any write."""
    lease = lease_in_phase(plane, "active", now=100)
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=r"^live turn completion must be "):
        plane.complete_live_turn(lease, 1_000, {"outcome": "completed"})  # type: ignore[arg-type]
    assert table_dump(database_url) == before


@pytest.mark.parametrize("now", [-1, True, 1.5, "1000", 2**53], ids=repr)
def test_completion_timestamp_must_be_a_non_negative_safe_integer(
    plane: AdmissionPlane, database_url: str, now: object
) -> None:
    """A completion time that is not a non-negative safe integer is refused and nothing is written."""
    lease = lease_in_phase(plane, "active", now=100)
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=r"^live turn completion timestamp must be "):
        plane.complete_live_turn(lease, now, COMPLETED)  # type: ignore[arg-type]
    assert table_dump(database_url) == before


def test_completion_validation_precedes_the_lease_lookup(plane: AdmissionPlane) -> None:
    """An invalid completion is reported even for a lease that does not exist, before the lease is looked up."""
    fence = LeaseFence("00000000-0000-4000-8000-000000000000", 1, "owner-1")
    with pytest.raises(InvalidInputError):
        plane.complete_live_turn(fence, 1_000, "completed")  # type: ignore[arg-type]
    with pytest.raises(UnknownLeaseError):
        plane.complete_live_turn(fence, 1_000, COMPLETED)


# --- cancelled / failed live outcomes -------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["cancelled", "failed"])
def test_cancelled_and_uncategorised_failed_complete_like_a_success(
    plane: AdmissionPlane, database_url: str, outcome: str
) -> None:
    """Cancelled and uncategorised failed outcomes journal the same two events as a success and free the lease without a
    cooldown."""
    lease = lease_in_phase(plane, "active", now=100)
    after = len(event_kinds(database_url))
    plane.complete_live_turn(lease, 1_000, LiveTurnCompletion(outcome))  # type: ignore[arg-type]
    assert new_events(database_url, after) == [
        ("request_provider_terminal", "active", "provider_terminal", 1_000),
        ("request_released", "provider_terminal", outcome, 1_000),
    ]
    assert terminal(database_url) == (outcome, 1_000)
    assert (count(database_url, "leases"), count(database_url, "cooldowns")) == (0, 0)


@pytest.mark.parametrize("outcome", ["cancelled", "failed"])
def test_ended_live_turn_is_never_admitted_again(plane: AdmissionPlane, database_url: str, outcome: str) -> None:
    """After a cancelled or failed outcome the request is never admitted again."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.complete_live_turn(lease, 1_000, LiveTurnCompletion(outcome))  # type: ignore[arg-type]
    assert plane.admit_next(2_000, owner(plane)) is None
    assert request_state(database_url, "r1") == outcome


# --- abandon before prompt ------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
@pytest.mark.parametrize("phase", ["admitted", "starting", "dispatch_intent"])
def test_abandon_before_prompt_ends_the_request_with_the_outcome(
    plane: AdmissionPlane, database_url: str, phase: str, outcome: str
) -> None:
    """Abandoning before the prompt ends the request with the given outcome, deletes payload and lease, and journals one
    event."""
    lease = lease_in_phase(plane, phase, now=100)
    after = len(event_kinds(database_url))
    plane.abandon_before_prompt(lease, 1_000, outcome)
    assert terminal(database_url) == (outcome, 1_000)
    assert (count(database_url, "turn_payloads"), count(database_url, "leases")) == (0, 0)
    assert new_events(database_url, after) == [("request_abandoned", phase, outcome, 1_000)]


@pytest.mark.parametrize("phase", ["dispatch_ambiguous", "active", "recovery_required"])
def test_abandon_after_a_possible_prompt_write_is_refused(plane: AdmissionPlane, database_url: str, phase: str) -> None:
    """Once a prompt may have been written the lease is not safely abandonable, and abandoning changes nothing."""
    lease = lease_in_phase(plane, phase, now=100)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease is not safely abandonable before prompt write")):
        plane.abandon_before_prompt(lease, 1_000, "cancelled")
    assert table_dump(database_url) == before


@pytest.mark.parametrize("outcome", ["completed", "queued", "recovery_required", "bogus", None], ids=repr)
def test_abandon_with_any_other_outcome_is_refused_before_any_write(
    plane: AdmissionPlane, database_url: str, outcome: object
) -> None:
    """An abandonment outcome other than failed or cancelled is refused and changes nothing."""
    lease = lease_in_phase(plane, "starting", now=100)
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError):
        plane.abandon_before_prompt(lease, 1_000, outcome)  # type: ignore[arg-type]
    assert table_dump(database_url) == before


# --- soft drain completes when the last seat is freed ----------------------------------------------------

SEAT_FREEING: dict[str, tuple[str, Callable[[AdmissionPlane, AdmittedLease, int], object]]] = {
    "abandon_before_prompt": ("starting", lambda p, lease, now: p.abandon_before_prompt(lease, now, "cancelled")),
    "release_exited_recovery_seat": ("active", lambda p, lease, now: p.release_exited_recovery_seat(lease, now)),
    "complete_live_turn": ("active", lambda p, lease, now: p.complete_live_turn(lease, now, COMPLETED)),
}


@pytest.mark.parametrize("operation", SEAT_FREEING)
def test_freeing_the_last_seat_completes_a_soft_drain(
    make_plane: Callable[..., AdmissionPlane], database_url: str, operation: str
) -> None:
    """Freeing the last seat while draining to one seat completes the drain in the same call."""
    durable = Policy(3, 1, 2_000, 1_800_000, 30_000)
    plane = make_plane(policy=durable)
    plane.claim_durable_policy(durable, "operator", 50)
    phase, free = SEAT_FREEING[operation]
    lease = lease_in_phase(plane, phase, now=100)
    plane.begin_soft_drain_to_1("operator", 500)
    free(plane, lease, 1_000)
    assert query(database_url, "SELECT max_active_turns, drain_state, updated_at FROM policy_state") == [
        (1, "steady", 1_000)
    ]
    assert event_kinds(database_url)[-1] == ("policy_drain_completed", "policy_soft_draining_to_1", "policy_steady")


# --- execution recovery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["starting", "dispatch_intent", "dispatch_ambiguous", "active"])
def test_execution_recovery_retains_the_lease_as_recovery_required(
    plane: AdmissionPlane, database_url: str, phase: str
) -> None:
    """mark_execution_recovery_required moves lease and request to recovery_required at now, deletes the payload and
    journals one event."""
    lease = lease_in_phase(plane, phase, now=100)
    after = len(event_kinds(database_url))
    plane.mark_execution_recovery_required(lease, 1_000)
    assert terminal(database_url) == ("recovery_required", 1_000)
    assert query(database_url, "SELECT phase, heartbeat_at FROM leases") == [("recovery_required", 1_000)]
    assert count(database_url, "turn_payloads") == 0
    assert new_events(database_url, after) == [("request_recovery_required", phase, "recovery_required", 1_000)]


@pytest.mark.parametrize(("phase", "identities"), [("starting", 0), ("dispatch_intent", 1), ("active", 1)])
def test_execution_recovery_keeps_the_seat_and_any_identity_visible_to_recovery(
    plane: AdmissionPlane, database_url: str, phase: str, identities: int
) -> None:
    """A lease kept in recovery_required keeps its process identity, if it had one, and is listed as a recoverable
    dispatch."""
    lease = lease_in_phase(plane, phase, now=100)
    plane.mark_execution_recovery_required(lease, 1_000)
    assert count(database_url, "lease_process_identities") == identities
    (listed,) = plane.list_recoverable_dispatches()
    assert (listed.fence, listed.phase, listed.heartbeat_at) == (lease.fence, "recovery_required", 1_000)
    assert (listed.process_identity is not None) == bool(identities)


def test_execution_recovery_of_a_recovery_required_lease_is_a_silent_no_op(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Marking an already recovery_required lease again changes nothing and journals nothing."""
    lease = lease_in_phase(plane, "recovery_required", now=100)
    before = table_dump(database_url)
    plane.mark_execution_recovery_required(lease, 2_000)
    assert table_dump(database_url) == before


def test_execution_recovery_from_admitted_is_refused(plane: AdmissionPlane, database_url: str) -> None:
    """An admitted lease has dispatched nothing, so marking it for execution recovery raises `lease cannot enter
    execution recovery`."""
    lease = lease_in_phase(plane, "admitted", now=100)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease cannot enter execution recovery")):
        plane.mark_execution_recovery_required(lease, 1_000)
    assert table_dump(database_url) == before


# --- release of an exited recovery seat -----------------------------------------------------------------


@pytest.mark.parametrize("phase", SEAT_PHASES)
def test_release_exited_recovery_seat_frees_the_seat_from_every_seat_phase(
    plane: AdmissionPlane, database_url: str, phase: str
) -> None:
    """From any seat phase, releasing the recovery seat ends the request recovery_required, deletes payload and lease,
    and journals one event."""
    lease = lease_in_phase(plane, phase, now=100)
    after = len(event_kinds(database_url))
    plane.release_exited_recovery_seat(lease, 1_000)
    assert terminal(database_url) == ("recovery_required", 1_000)
    assert (count(database_url, "turn_payloads"), count(database_url, "leases")) == (0, 0)
    assert new_events(database_url, after) == [("request_recovery_seat_released", phase, "recovery_required", 1_000)]


def test_released_recovery_request_has_no_payload_to_read(plane: AdmissionPlane) -> None:
    """After the recovery seat is released, reading the payload raises `no payload is available`."""
    lease = lease_in_phase(plane, "dispatch_intent", now=100)
    plane.release_exited_recovery_seat(lease, 1_000)
    with pytest.raises(AdmissionStateError, match=exactly("no payload is available")):
        plane.read_payload("r1", 1_001)


# --- recovery never requeues ---------------------------------------------------------------------------


@pytest.mark.parametrize("release", [False, True], ids=["retained", "released"])
def test_recovery_required_request_is_never_admitted_again(
    one_seat: AdmissionPlane, database_url: str, release: bool
) -> None:
    """A recovery_required request is never admitted again, whether its seat is retained or released."""
    lease = lease_in_phase(one_seat, "active", now=100)
    one_seat.mark_execution_recovery_required(lease, 1_000)
    if release:
        one_seat.release_exited_recovery_seat(lease, 1_001)
    enqueue(one_seat, "r2", agent_id="agent-b", now=1_100)
    admitted = one_seat.admit_next(2_000, owner(one_seat))
    if release:
        assert admitted is not None
        assert admitted.request_id == "r2"
    else:
        assert admitted is None
    assert request_state(database_url, "r1") == "recovery_required"
    assert count(database_url, "leases", "request_id = 'r1'") == (0 if release else 1)
