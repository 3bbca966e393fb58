"""What PostgreSQL does in fewer round trips (issue 16), checked on both dialects, and the round trips themselves.

On PostgreSQL an admission reads its facts, the lanes' keys and the first page of agents of the keys with the
oldest heads in one statement (``ADMISSION_READS``) and reserves in one (``ADMIT_REQUEST``); a plain phase move
(dispatch intent, active, ambiguous dispatch) runs its fenced update without reading the lease first. The cases
below must therefore come out the same on SQLite, which reads each part with its own statement: walks past a
full prefetched page and past the keys the prefetch covers, requests to time out first, and every refusal of a
move, which must change nothing.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from admission_index import assert_index_consistent
from dbutil import POSTGRES_ONLY, execute, is_postgres, table_dump
from planes import PlaneFactory, activate, dispatch_record, enqueue, lease_in_phase

from admission_plane import (
    AdmissionConflictError,
    AdmissionPlane,
    AdmissionStateError,
    Budget,
    BudgetError,
    InvalidInputError,
    Lane,
    LeaseFence,
    LeaseFenceError,
    LiveTurnCompletion,
    Policy,
    RequestState,
    UnknownLeaseError,
)
from admission_plane.service import _admission
from admission_plane.service._selection import PAGE
from admission_plane.service._wake import Wake
from admission_plane.store import group_commit
from admission_plane.store.session_functions import REQUEST_DIVERGED
from admission_plane.store.statements.admission import FIRST_PAGE_KEYS

ROOMY = Policy(32, 32, 0, 1_800_000, 30_000)


def busy(plane: AdmissionPlane, agent: str, model: str, now: int) -> None:
    """``agent`` holds a seat (an active turn) and has one more request queued in ``model`` at ``now``."""
    enqueue(plane, f"{agent}-held", agent, now - 500, model=model, session_id=f"s-{agent}")
    lease = plane.admit_request(f"{agent}-held", now - 400, plane.owner_identity.owner_instance_id)
    assert lease is not None
    activate(plane, lease, now - 400)
    enqueue(plane, f"{agent}-next", agent, now, model=model, session_id=f"s-{agent}")


def test_an_idle_agent_behind_more_than_a_page_of_busy_agents_is_admitted(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Idle agents go first: with more than one page of busy agents' heads ahead of it in the key, the idle
    agent's request is the one admitted (the walk goes on past the first page, read with the facts on PostgreSQL)."""
    plane = make_plane(policy=ROOMY)
    for n in range(PAGE + 1):
        busy(plane, f"busy-{n:02}", "m1", 10_000 + n)
    enqueue(plane, "idle-request", "idle-agent", 20_000, model="m1", session_id="s-idle")
    lease = plane.admit_next(30_000, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert lease.request_id == "idle-request"
    assert_index_consistent(database_url)


def test_an_idle_agent_in_a_key_past_the_prefetched_keys_is_admitted(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """With the oldest-headed keys holding only busy agents' requests, the idle agent's request in a later key is
    admitted (keys beyond the ones whose first page is read with the facts are walked with their own statement)."""
    plane = make_plane(policy=ROOMY)
    for n in range(FIRST_PAGE_KEYS + 1):
        busy(plane, f"busy-{n}", f"m{n}", 10_000 + n)
    enqueue(plane, "idle-request", "idle-agent", 20_000, model="m-late", session_id="s-idle")
    lease = plane.admit_next(30_000, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert lease.request_id == "idle-request"
    assert_index_consistent(database_url)


def test_admission_times_out_expired_requests_then_admits_the_rest(make_plane: PlaneFactory, database_url: str) -> None:
    """A request past its queue deadline is timed out by the admission that finds it, which then admits the
    next request in the same transaction; a waiter's look reports that a write is due."""
    plane = make_plane(policy=Policy(4, 4, 0, 1_000, 30_000))
    enqueue(plane, "stale", "agent-1", 1_000, expires_at=10_000_000)
    enqueue(plane, "fresh", "agent-2", 5_000, expires_at=10_000_000)
    lease = plane.admit_next(2_500, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert lease.request_id == "fresh"
    stale = plane.get_request("stale")
    assert stale is not None
    assert stale.state == RequestState.QUEUE_TIMEOUT
    assert_index_consistent(database_url)


@pytest.mark.parametrize("parallel", [False, True], ids=["look", "parallel-look"])
def test_a_waiters_look_reads_its_entry_and_the_agents_ahead_with_the_facts(
    make_plane: PlaneFactory, database_url: str, statements: list[str], parallel: bool
) -> None:
    """A waiter behind two idle agents is told to wait for two departures, on both dialects; the rule's next
    choice, held back by the seat alone, is told to wait for a seat, with the hint that an attempt may then go
    to the server at once (``Wake.first``). On PostgreSQL each look is one round trip: its entry and the first
    page of agents of its key come with the facts. A waiter's look (``parallel``) asks both whether it may go
    beside the requests ahead and how many must leave first: the agents ahead are read once for both."""
    seats = 3 if parallel else 1  # parallel: two free seats, one short of the three the waiter would need
    plane = make_plane(policy=Policy(seats, seats, 0, 1_800_000, 30_000))
    owner = plane.owner_identity.owner_instance_id
    for n in range(seats - 2 if parallel else seats):
        held = lease_in_phase(plane, "active", f"held-{n}", now=1_000 + 10 * n, agent_id=f"holder-{n}")
        assert held is not None
    for n, agent in enumerate(("agent-a", "agent-b", "agent-c")):
        enqueue(plane, f"queued-{agent}", agent, 5_000 + n, session_id=f"s-{agent}")
    statements.clear()
    lease, wake = _admission.admit_request(plane._ctx, "queued-agent-c", 6_000, owner, parallel=parallel)
    assert lease is None
    assert wake == Wake(queue=2)
    assert not wake.first
    if is_postgres(database_url):
        assert len(statements) == 1, statements
    if parallel:
        return
    statements.clear()
    lease, wake = _admission.admit_request(plane._ctx, "queued-agent-a", 6_000, owner)
    assert lease is None
    assert wake == Wake(queue=1, seats=True)
    assert wake.first
    if is_postgres(database_url):
        assert len(statements) == 1, statements


def test_a_refused_move_changes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """``mark_active`` with a stale generation, another owner, an unknown lease or from the wrong phase raises
    its refusal and leaves every row as it was (the lease, its request and the payload it would delete)."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "r", "agent-1", 1_000)
    lease = plane.admit_request("r", 1_001, plane.owner_identity.owner_instance_id)
    assert lease is not None
    plane.mark_starting(lease, 1_002)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match="lease is not dispatch_intent"):
        plane.mark_active(lease, 1_003)  # still starting
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    before = table_dump(database_url)
    stale = LeaseFence(lease.lease_id, lease.generation + 1, lease.owner_instance_id)
    with pytest.raises(LeaseFenceError):
        plane.mark_active(stale, 1_004)
    other = LeaseFence(lease.lease_id, lease.generation, "someone-else")
    with pytest.raises(LeaseFenceError):
        plane.mark_active(other, 1_004)
    with pytest.raises(UnknownLeaseError):
        plane.mark_active(LeaseFence("no-such-lease", 1, lease.owner_instance_id), 1_004)
    assert table_dump(database_url) == before
    plane.mark_active(lease, 1_005)
    assert table_dump(database_url) != before
    request = plane.get_request("r")
    assert request is not None
    assert request.state == RequestState.ACTIVE


def test_a_refused_completion_changes_nothing(make_plane: PlaneFactory, database_url: str) -> None:
    """``complete_live_turn`` (PostgreSQL: both edges in one statement, the lease unread) with a stale generation,
    another owner, an unknown lease, from the wrong phase or a second time raises its refusal and leaves every row
    as it was; the accepted one ends the request, frees the seat and journals both steps."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "r", "agent-1", 1_000)
    lease = plane.admit_request("r", 1_001, plane.owner_identity.owner_instance_id)
    assert lease is not None
    plane.mark_starting(lease, 1_002)
    done = LiveTurnCompletion("completed")
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match="lease is not active"):
        plane.complete_live_turn(lease, 1_003, done)  # still starting
    assert table_dump(database_url) == before
    activate_rest(plane, lease)
    before = table_dump(database_url)
    for fence, refusal in (
        (LeaseFence(lease.lease_id, lease.generation + 1, lease.owner_instance_id), LeaseFenceError),
        (LeaseFence(lease.lease_id, lease.generation, "someone-else"), LeaseFenceError),
        (LeaseFence("no-such-lease", 1, lease.owner_instance_id), UnknownLeaseError),
    ):
        with pytest.raises(refusal):
            plane.complete_live_turn(fence, 1_010, done)
        assert table_dump(database_url) == before
    plane.complete_live_turn(lease, 1_011, done)
    request = plane.get_request("r")
    assert request is not None
    assert request.state == RequestState.COMPLETED
    after = table_dump(database_url)
    assert after["leases"] == [], "the seat is freed"
    kinds = [event.kind for event in plane.read_sanitized_events(limit=100)]
    assert kinds[-2:] == ["request_provider_terminal", "request_released"]
    with pytest.raises(UnknownLeaseError):
        plane.complete_live_turn(lease, 1_012, done)
    assert table_dump(database_url) == after


def activate_rest(plane: AdmissionPlane, lease: Any) -> None:
    """A starting ``lease`` through its dispatch intent to ``active``."""
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    plane.mark_active(lease, 1_005)


def test_starting_applies_a_live_revision_read_with_the_lease(make_plane: PlaneFactory) -> None:
    """``mark_starting`` applies the policy in force, not the plane's own (PostgreSQL reads it in the same statement
    as the lease): two leases admitted under two starts, then a revision to one start and a 2 s interval, and the
    second start is refused."""
    plane = make_plane(policy=Policy(4, 2, 0, 1_800_000, 30_000))
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "a", "agent-a", 1_000)
    enqueue(plane, "b", "agent-b", 1_001)
    first, second = plane.admit_next(1_002, owner), plane.admit_next(1_003, owner)
    assert first is not None
    assert second is not None
    plane.set_policy(Policy(4, 1, 2_000, 1_800_000, 30_000), now=1_004)
    plane.mark_starting(first, 1_005)
    with pytest.raises(AdmissionStateError, match=r"concurrent start limit reached|start interval has not elapsed"):
        plane.mark_starting(second, 1_006)


def test_a_replay_is_answered_before_the_refusals_of_the_policy_in_force(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """An enqueue inserts first and reads the stored request only on a conflict or a refusal, yet answers as the
    original does: under a connector whose policy would refuse the request (its lane unknown, its estimate over
    every budget), an exact replay is idempotent and a replay with other metadata conflicts; a new request is
    refused with the policy's own error. The conflict and the refusals write nothing."""
    first = make_plane(policy=attrs.evolve(ROOMY, lanes=(Lane("interactive"), Lane("batch"))))
    enqueue(first, "r", "agent-1", 1_000, lane="batch", estimated_tokens=5_000)
    strict = make_plane(policy=attrs.evolve(ROOMY, budgets=(Budget("antigravity", max_tokens=1_000),)))
    assert enqueue(strict, "r", "agent-1", 1_000, lane="batch", estimated_tokens=5_000).existed
    before = table_dump(database_url)  # the replay recorded the second connector; nothing below writes
    with pytest.raises(AdmissionConflictError):
        enqueue(strict, "r", "agent-1", 1_000, lane="batch", estimated_tokens=4_000)
    with pytest.raises(InvalidInputError, match="lane"):
        enqueue(strict, "new", "agent-1", 1_000, lane="batch")
    with pytest.raises(BudgetError):
        enqueue(strict, "new", "agent-1", 1_000, estimated_tokens=5_000)
    assert table_dump(database_url) == before
    assert_index_consistent(database_url)


def test_a_dispatch_intent_of_a_starting_lease_with_stray_evidence_is_refused_and_changes_nothing(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """Process evidence for a lease still ``starting`` (only a damaged database holds it: the intent that records
    it moves the lease on) is read with the lease in one statement and refuses the intent as
    ``conflicting_intent``, leaving every row as it was."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "r", "agent-1", 1_000)
    lease = plane.admit_request("r", 1_001, plane.owner_identity.owner_instance_id)
    assert lease is not None
    plane.mark_starting(lease, 1_002)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    execute(database_url, f"UPDATE leases SET phase = 'starting' WHERE lease_id = '{lease.lease_id}'")
    execute(database_url, "UPDATE turn_requests SET state = 'starting' WHERE request_id = 'r'")
    before = table_dump(database_url)
    result = plane.commit_dispatch_intent(dispatch_record(plane, lease))
    assert (result.status, result.reason) == ("not_committed", "conflicting_intent")
    assert table_dump(database_url) == before


@pytest.mark.parametrize("operation", ["starting", "dispatch"])
def test_a_request_diverged_from_its_locked_lease_refuses_the_move_and_changes_nothing(
    make_plane: PlaneFactory, database_url: str, operation: str
) -> None:
    """A move of a lease the unit holds locked is checked on the server with the commit on PostgreSQL (and at
    once on SQLite): a request whose state no longer matches its lease (only a damaged database holds one)
    refuses the move with :class:`AdmissionStateError` on both dialects (a dispatch intent answers
    ``transaction_fault``), and nothing is committed."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "r", "agent-1", 1_000)
    lease = plane.admit_request("r", 1_001, plane.owner_identity.owner_instance_id)
    assert lease is not None
    if operation == "dispatch":
        plane.mark_starting(lease, 1_002)
    execute(database_url, "UPDATE turn_requests SET state = 'recovery_required' WHERE request_id = 'r'")
    before = table_dump(database_url)
    if operation == "starting":
        with pytest.raises(AdmissionStateError, match="diverged at starting") as refused:
            plane.mark_starting(lease, 1_003)
        cause = refused.value.__cause__
        refused_by = getattr(getattr(cause, "orig", cause), "sqlstate", None)
        assert refused_by == (REQUEST_DIVERGED if is_postgres(database_url) else None)  # the server's check
    else:
        result = plane.commit_dispatch_intent(dispatch_record(plane, lease))
        assert (result.status, result.reason) == ("not_committed", "transaction_fault")
    assert table_dump(database_url) == before


# --- PostgreSQL: round trips per operation -------------------------------------------------------------------------


@POSTGRES_ONLY
def test_a_steady_state_turn_costs_its_documented_round_trips(make_plane: PlaneFactory, statements: list[str]) -> None:
    """On PostgreSQL a steady-state turn (after the connector's first two) is 7 round trips. A unit's first carries
    ``BEGIN``, the gates and the unit's first statement (``EXECUTE`` of it, prepared by name); its last carries
    the journal, the writes nobody reads back and ``COMMIT``. ``admit_request`` is 2, a read-only look (one
    statement) then the admission sent whole (``BEGIN``, the admission gate, the reservation the server decides
    and checks, which returns the new lease's generation, and ``COMMIT``; a waiter's first attempt skips the look:
    ``test_blind_admission``). Enqueue with payload (once the connector's
    record was seen) and, given the ``AdmittedLease``, starting, the dispatch intent, active and the completion
    read nothing first: 1 each, ``BEGIN``, the gate, the insert or the edge checked on the server
    (``SENT_REQUEST``, ``sent_move``, ``sent_release``), the rest of the unit and ``COMMIT`` in one message (a
    unit that holds the admission gate at its commit then flushes in the same message: ``store.group_commit``). A
    change that adds a round trip to the hot path fails."""
    plane = make_plane(policy=ROOMY)
    owner = plane.owner_identity.owner_instance_id

    def turn(request_id: str, now: int) -> dict[str, int]:
        counts: dict[str, int] = {}

        def step(name: str, call: Any) -> Any:
            statements.clear()
            result = call()
            counts[name] = len(statements)
            # A unit holding the admission gate at its commit ends with the group commit's flush, same message.
            ends = [sent for sent in statements if sent.endswith("COMMIT")]
            carried.extend(
                sent.replace(f"{group_commit.POSTGRES_ASYNC}; ", "").removesuffix(f"; {group_commit.POSTGRES_FLUSH}")
                for sent in ends
            )
            return result

        step("enqueue", lambda: enqueue(plane, request_id, "agent-1", now))
        lease = step("admission", lambda: plane.admit_request(request_id, now + 1, owner))
        assert lease is not None
        step("starting", lambda: plane.mark_starting(lease, now + 2))
        step("dispatch", lambda: plane.commit_dispatch_intent(dispatch_record(plane, lease)))
        step("active", lambda: plane.mark_active(lease, now + 4))
        step("completion", lambda: plane.complete_live_turn(lease, now + 5, LiveTurnCompletion("completed")))
        return counts

    carried: list[str] = []
    turn("first", 10_000)  # the connector's record is written with its first request
    turn("second", 20_000)  # its enqueue is the first sent whole (the record was seen): prepared after its commit
    carried.clear()
    counts = turn("third", 30_000)
    # What a commit carries was prepared by name after the first turn's commits: it runs as EXECUTE (no parse,
    # analysis or planning of its text on the server); only the gate, the doorbell and COMMIT are text.
    parts = [part for sent in carried for part in re.split(r"; (?=EXECUTE |SELECT |COMMIT$)", sent)]
    assert len(carried) == 6  # one commit per unit
    texts = [part for part in parts if not part.startswith(("EXECUTE admission_plane_", "COMMIT"))]
    opening = re.compile(r"SELECT pg_(advisory_xact_lock(_shared)?|notify)\(|BEGIN ISOLATION LEVEL READ COMMITTED$")
    assert all(opening.match(text) for text in texts), [text for text in texts if not opening.match(text)]
    assert counts == {
        "enqueue": 1,
        "admission": 2,
        "starting": 1,
        "dispatch": 1,
        "active": 1,
        "completion": 1,
    }, counts
