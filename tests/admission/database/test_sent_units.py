"""Lease units sent whole with their commit (PostgreSQL), and the long way they fall back to.

Given the :class:`AdmittedLease`, starting, the dispatch intent, active and a live turn's completion read
nothing first on PostgreSQL: the unit's edge and writes travel with ``COMMIT`` in one message, and the
server checks what the unit assumed (``pg_temp.admission_plane_expect_sent``). When anything else holds
(a refusal, a replay, a policy revision, a budget reservation to settle), nothing is committed and the unit
runs again the long way, reading first, which answers exactly as before. These tests drive each such case
on both dialects (SQLite always takes the long way), check the answer and that a refusal changes nothing,
and on PostgreSQL that the server did refuse the sent unit (so the case is the fallback's, not a read's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from dbutil import execute, is_postgres, query, table_dump
from planes import PlaneFactory, dispatch_record, enqueue, lease_in_phase
from sqlalchemy import Integer, bindparam, literal_column, select

from admission_plane import (
    AdmissionConflictError,
    AdmissionPlane,
    AdmissionStateError,
    AdmittedLease,
    Budget,
    LeaseFenceError,
    LiveTurnCompletion,
    PayloadConflictError,
    Policy,
    UnknownLeaseError,
)
from admission_plane.store.tx import Returned, Scalar, Statement, Tx
from admission_plane.store.unit_of_work import Gate, run

ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)
COMPLETED = LiveTurnCompletion("completed")


def refused_sent(database_url: str) -> int:
    """How many fallbacks a refusal below must have caused: one on PostgreSQL, none on SQLite."""
    return 1 if is_postgres(database_url) else 0


def _other_generation(lease: AdmittedLease) -> AdmittedLease:
    return attrs.evolve(lease, generation=lease.generation + 1)


def _unknown(lease: AdmittedLease) -> AdmittedLease:
    return attrs.evolve(lease, lease_id="no-such-lease")


REFUSALS = [
    # (phase the lease is in, operation, how the argument is spoiled, the error and its message)
    ("starting", "start", None, AdmissionStateError, "lease is not admitted"),
    ("admitted", "start", _other_generation, LeaseFenceError, None),
    ("admitted", "start", _unknown, UnknownLeaseError, None),
    ("starting", "active", None, AdmissionStateError, "lease is not dispatch_intent"),
    ("dispatch_intent", "active", _other_generation, LeaseFenceError, None),
    ("active", "active", _unknown, UnknownLeaseError, None),
    ("dispatch_intent", "complete", None, AdmissionStateError, "lease is not active"),
    ("active", "complete", _other_generation, LeaseFenceError, None),
    ("active", "complete", _unknown, UnknownLeaseError, None),
]


@pytest.mark.parametrize(("phase", "operation", "spoil", "error", "message"), REFUSALS)
def test_a_refused_sent_unit_answers_with_the_long_ways_refusal_and_changes_nothing(
    make_plane: PlaneFactory,
    database_url: str,
    fallbacks: list[str],
    phase: str,
    operation: str,
    spoil: Callable[[AdmittedLease], AdmittedLease] | None,
    error: type[Exception],
    message: str | None,
) -> None:
    """A start, an activation or a completion of a lease in another phase, under another fence or unknown is
    refused with the operation's own error and message (the server refused the sent unit; the long way read
    the lease and chose the refusal), and every row stays as it was."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, phase)
    argument = lease if spoil is None else spoil(lease)
    before = table_dump(database_url)
    fallbacks.clear()
    call = {
        "start": lambda: plane.mark_starting(argument, 2_000),
        "active": lambda: plane.mark_active(argument, 2_000),
        "complete": lambda: plane.complete_live_turn(argument, 2_000, COMPLETED),
    }[operation]
    with pytest.raises(error, match=message):
        call()
    assert table_dump(database_url) == before
    assert len(fallbacks) == refused_sent(database_url)


@pytest.mark.parametrize(
    ("second_child", "expected"),
    [(False, ("committed", True, None)), (True, ("not_committed", None, "conflicting_intent"))],
    ids=["replay", "other-child"],
)
def test_a_dispatch_intent_replayed_through_the_sent_unit_is_answered_from_the_committed_one(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str], second_child: bool, expected: tuple[Any, ...]
) -> None:
    """A second dispatch intent of a lease already in ``dispatch_intent`` is refused by the server when sent
    whole; the long way reads the committed evidence and answers ``committed`` (idempotent) for the same
    record and ``conflicting_intent`` for another child, writing nothing either way."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "starting")
    record = dispatch_record(plane, lease)
    assert plane.commit_dispatch_intent(record).ok
    before = table_dump(database_url)
    fallbacks.clear()
    again = attrs.evolve(record, child=attrs.evolve(record.child, pid=record.child.pid + 1)) if second_child else record
    result = plane.commit_dispatch_intent(again)
    assert (result.status, result.idempotent, result.reason) == expected
    assert table_dump(database_url) == before
    assert len(fallbacks) == refused_sent(database_url)


@pytest.mark.parametrize("operation", ["start", "dispatch", "active", "complete"])
def test_an_admitted_lease_naming_another_request_moves_only_its_own_lease_and_request(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str], operation: str
) -> None:
    """Hostile input: an :class:`AdmittedLease` whose ``request_id`` names another live request (built by hand;
    the fence is right). The server refuses the sent unit (the lease names its own request), the long way
    moves the lease by its fence, and the journal correlates the lease's own request: the other request's
    state and events are untouched."""
    plane = make_plane(policy=ROOMY)
    phase = {"start": "admitted", "dispatch": "starting", "active": "dispatch_intent", "complete": "active"}[operation]
    lease = lease_in_phase(plane, phase, "mine")
    other = lease_in_phase(plane, phase, "other", agent_id="agent-b")
    forged = attrs.evolve(lease, request_id=other.request_id)
    journal = plane._ctx.keys.correlation
    before = {journal(name): _events(database_url, journal(name)) for name in ("mine", "other")}
    fallbacks.clear()
    if operation == "start":
        plane.mark_starting(forged, 2_000)
    elif operation == "dispatch":
        # A dispatch record names its request itself: one naming another request is a stale lease.
        result = plane.commit_dispatch_intent(dispatch_record(plane, forged))
        assert (result.status, result.reason) == ("not_committed", "stale_lease")
    elif operation == "active":
        plane.mark_active(forged, 2_000)
    else:
        plane.complete_live_turn(forged, 2_000, COMPLETED)
    assert len(fallbacks) == refused_sent(database_url)
    assert plane.get_request("other").state == phase
    assert _events(database_url, journal("other")) == before[journal("other")]
    mine = plane.get_request("mine").state
    if operation == "dispatch":
        assert mine == phase
        assert _events(database_url, journal("mine")) == before[journal("mine")]
    else:
        assert mine != phase
        assert len(_events(database_url, journal("mine"))) > len(before[journal("mine")])


def _events(database_url: str, correlation: str) -> list[tuple[Any, ...]]:
    return query(
        database_url, "SELECT kind, from_state, to_state FROM events WHERE correlation_hmac = ? ORDER BY event_seq",
        (correlation,),
    )  # fmt: skip


def _two_admitted(plane: AdmissionPlane) -> tuple[AdmittedLease, AdmittedLease]:
    """Requests ``a`` and ``b`` enqueued and admitted by ``plane``: their leases."""
    owner = plane.owner_identity.owner_instance_id
    for name in ("a", "b"):
        enqueue(plane, name, f"agent-{name}", 1_000)
    first, second = plane.admit_next(1_001, owner), plane.admit_next(1_002, owner)
    assert first is not None
    assert second is not None
    return first, second


def test_a_start_after_a_live_revision_is_refused_once_then_takes_the_revisions_long_way(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A start sent whole assumes the durable policy's revision the plane last read (none, for a plane that
    never read one). After another plane's live revision (one start at a time, 2 s apart) the server
    refuses it once; the long way reads the revision and applies it, and the plane's next start takes the long
    way at once (a revision's start interval needs the start history read), refused by the revision."""
    plane = make_plane(policy=ROOMY)
    first, second = _two_admitted(plane)
    make_plane(policy=ROOMY).set_policy(Policy(8, 1, 2_000, 1_800_000, 30_000), now=1_003)
    fallbacks.clear()
    plane.mark_starting(first, 1_004)
    assert len(fallbacks) == refused_sent(database_url)
    assert plane.get_request("a").state == "starting"
    with pytest.raises(AdmissionStateError, match=r"concurrent start limit reached|start interval has not elapsed"):
        plane.mark_starting(second, 1_005)
    assert len(fallbacks) == refused_sent(database_url)  # no second refusal: the plane knew the revision


def test_a_start_sent_by_a_plane_with_a_lower_start_limit_is_held_to_it(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A start sent whole assumes the start window within the plane's start limit. A plane allowing one start
    at a time starts two leases another plane admitted under eight: the server refuses both sent starts (the
    window holds two), and the long way counts the starts: the first starts, the second is refused."""
    admitting = make_plane(policy=ROOMY)
    starting = make_plane(policy=Policy(8, 1, 0, 1_800_000, 30_000))
    first, second = _two_admitted(admitting)
    fallbacks.clear()
    starting.mark_starting(first, 1_003)
    with pytest.raises(AdmissionStateError, match="concurrent start limit reached"):
        starting.mark_starting(second, 1_004)
    assert len(fallbacks) == 2 * refused_sent(database_url)
    assert (starting.get_request("a").state, starting.get_request("b").state) == ("starting", "admitted")


def test_a_completion_with_a_budget_to_settle_takes_the_long_way_and_settles_it(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A completion sent whole assumes nothing to settle. Completed through a plane that reserved no budget
    itself, a turn whose request holds a reservation is refused by the server once; the long way settles
    the reservation, and the plane's next completion takes the long way at once (no second refusal)."""
    budgeted = attrs.evolve(ROOMY, budgets=(Budget("antigravity", max_requests=10),))
    admitting = make_plane(policy=budgeted)
    completing = make_plane(policy=budgeted)
    first = lease_in_phase(admitting, "active", "r1")
    second = lease_in_phase(admitting, "active", "r2", agent_id="agent-b")
    fallbacks.clear()
    completing.complete_live_turn(first, 2_000, COMPLETED)
    assert len(fallbacks) == refused_sent(database_url)
    assert query(database_url, "SELECT state FROM budget_charges WHERE charge_id = ?", ("r1",)) == [("charged",)]
    completing.complete_live_turn(second, 2_001, COMPLETED)
    assert len(fallbacks) == refused_sent(database_url)
    assert query(database_url, "SELECT state FROM budget_charges WHERE charge_id = ?", ("r2",)) == [("charged",)]


def test_a_completion_freeing_the_last_seat_of_a_soft_drain_completes_it(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A completion sent whole assumes no soft drain is pending; with one pending, the server refuses it and
    the long way frees the seat and completes the drain (the durable policy settles at one seat)."""
    durable = Policy(3, 1, 2_000, 1_800_000, 30_000)
    plane = make_plane(policy=durable)
    owner = plane.owner_identity.owner_instance_id
    plane.claim_durable_policy(durable, owner, 900)
    lease = lease_in_phase(plane, "active")
    plane.begin_soft_drain_to_1(owner, 1_500)
    fallbacks.clear()
    plane.complete_live_turn(lease, 2_000, COMPLETED)
    assert len(fallbacks) == refused_sent(database_url)
    assert query(database_url, "SELECT drain_state, max_active_turns FROM policy_state") == [("steady", 1)]


def test_a_damaged_request_refuses_a_sent_activation_and_the_long_way_reports_it(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """A request whose state no longer matches its lease (only a damaged database holds one) refuses the sent
    activation; the long way reports the divergence and nothing is committed."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "dispatch_intent")
    execute(database_url, "UPDATE turn_requests SET state = 'recovery_required' WHERE request_id = 'r1'")
    before = table_dump(database_url)
    fallbacks.clear()
    with pytest.raises(AdmissionStateError, match="diverged"):
        plane.mark_active(lease, 2_000)
    assert table_dump(database_url) == before
    assert len(fallbacks) == refused_sent(database_url)


def _warm(plane: AdmissionPlane) -> None:
    """Two requests enqueued, so the plane has seen its connector's record (what an enqueue sent whole needs)."""
    enqueue(plane, "warm-1", "agent-w", 500)
    enqueue(plane, "warm-2", "agent-w", 501)
    assert plane._ctx.owner_recorded


@pytest.mark.parametrize("payload", [True, False], ids=["with-payload", "metadata-only"])
def test_an_enqueue_replayed_through_the_sent_unit_is_answered_from_the_stored_request(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str], payload: bool
) -> None:
    """An enqueue sent whole assumes a new request. A replay is refused by the server (nothing inserted); the
    long way answers it: the same request (and prompt) is idempotent, other metadata or another prompt is a
    conflict, and nothing changes."""
    plane = make_plane(policy=ROOMY)
    _warm(plane)

    def again(**overrides: Any) -> Any:
        if payload:
            return enqueue(plane, "r", "agent-1", 1_000, **overrides)
        fields = {"request_id": "r", "session_id": "session-1", "agent_id": "agent-1", "fingerprint": "fp"}
        return plane.enqueue(**{**fields, "provider": "antigravity", "model": "model-test", "now": 1_000, **overrides})

    assert not again().existed
    before = table_dump(database_url)
    fallbacks.clear()
    assert again().existed
    assert len(fallbacks) == refused_sent(database_url)
    with pytest.raises(AdmissionConflictError):
        again(model="another-model")
    if payload:
        with pytest.raises(PayloadConflictError):
            again(plaintext="another prompt")
    assert table_dump(database_url) == before
    assert len(fallbacks) == (3 if payload else 2) * refused_sent(database_url)


def test_an_enqueue_after_a_live_revision_is_refused_once_then_sent_under_the_revision(
    make_plane: PlaneFactory, database_url: str, fallbacks: list[str]
) -> None:
    """An enqueue sent whole assumes the durable policy's revision the plane last read. After another plane's
    live revision (a shorter queue timeout) the server refuses it once; the long way queues the request under
    the revision (its deadline), and the next enqueue is sent with the revision it read (no fallback)."""
    plane = make_plane(policy=ROOMY)
    _warm(plane)
    make_plane(policy=ROOMY).set_policy(Policy(8, 8, 2_000, 60_000, 30_000), now=900)
    fallbacks.clear()
    enqueue(plane, "first", "agent-1", 1_000)
    assert len(fallbacks) == refused_sent(database_url)
    enqueue(plane, "second", "agent-2", 1_001)
    assert len(fallbacks) == refused_sent(database_url)
    deadlines = query(
        database_url, "SELECT request_id, deadline_at FROM turn_requests WHERE request_id IN ('first', 'second')"
    )
    assert sorted(deadlines) == [("first", 61_000), ("second", 61_001)]


def test_an_adopted_request_with_a_past_generation_is_admitted_at_the_next_one(
    make_plane: PlaneFactory, database_url: str
) -> None:
    """An admission sends its reservation with its commit and reads the new lease's generation from the commit's
    results (PostgreSQL): a queued request whose generation is already 5 (a database the original wrote) gets a
    lease of generation 6, in the database and in the ``AdmittedLease``, which then starts the turn."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "adopted", "agent-1", 1_000)
    execute(database_url, "UPDATE turn_requests SET lease_generation = 5 WHERE request_id = 'adopted'")
    lease = plane.admit_request("adopted", 1_001, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert lease.generation == 6
    assert query(database_url, "SELECT generation FROM leases WHERE request_id = ?", ("adopted",)) == [(6,)]
    plane.mark_starting(lease, 1_002)
    assert plane.get_request("adopted").state == "starting"


@pytest.mark.parametrize("shape", ["whole-unit", "after-a-read", "flushed-by-a-read"])
def test_a_row_sent_with_the_commit_is_read_back_after_it(plane: Any, shape: str) -> None:
    """``Tx.send_returning``: on PostgreSQL the statement rides on the commit's round trip (after the unit's
    opening when no statement carried it) and its row is read from the commit's results; one flushed by a
    later statement is read then; on SQLite it runs at once. Each row is the statement's own."""
    answer = Statement(select((literal_column("40") + bindparam("n", type_=Integer)).label("answer")))
    probe = Scalar(select(literal_column("7")))

    def work(tx: Tx) -> list[Returned]:
        if shape == "after-a-read":
            assert tx.scalar(probe) == 7
        rows = [tx.send_returning(answer, {"n": 1}), tx.send_returning(answer, {"n": 2})]
        if shape == "flushed-by-a-read":
            assert tx.scalar(probe) == 7  # runs the held-back statements first
            assert all(returned.ran for returned in rows)
        return rows

    rows = run(plane.engine, work, gate=Gate.LEASE)
    assert [(returned.ran, returned.row) for returned in rows] == [(True, (41,)), (True, (42,))]
