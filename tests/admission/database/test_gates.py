"""PostgreSQL's two gates: what waits for what (``admission_plane.store.unit_of_work``, ``Gate``).

Each test holds one gate on a raw connection of its own, the way a unit in flight holds it, and
runs one plane operation on a thread: the operation must finish while the gate is held (it does
not wait for that unit) or must not finish until the gate is released (it does). A blocked
operation is always let go in ``finally``, so a failing test never leaves a thread waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dbutil import pg_engine
from planes import dispatch_record, enqueue, lease_in_phase
from sqlalchemy import Connection, text

from admission_plane import AdmissionPlane, AdmissionStateError, LiveTurnCompletion, Policy
from admission_plane.store.advisory import ADVISORY_LOCK_KEY, LEASE_LOCK_KEY, START_LOCK_KEY

pytestmark = pytest.mark.parametrize(
    "database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
#: Seats for everyone: only the gates can make an operation wait here.
ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)
#: How long an operation that must not wait is given, and how long one that must wait is watched (s).
FINISHES_WITHIN_S = 20.0
STILL_WAITING_AFTER_S = 0.5
_EVENT = text(
    "INSERT INTO events (kind, from_state, to_state, occurred_at, correlation_hmac) "
    "VALUES ('request_enqueued', 'absent', 'queued', 1000, :hmac) RETURNING event_seq"
)


@contextmanager
def holding(database_url: str, statement: str) -> Iterator[Connection]:
    """A transaction on a connection of its own that ran ``statement`` (a gate taken) and stays open until the
    block ends, then rolls back."""
    engine = pg_engine(database_url)
    with engine.connect() as connection:
        transaction = connection.begin()
        try:
            connection.execute(text(statement))
            yield connection
        finally:
            if transaction.is_active:
                transaction.rollback()


class Running:
    """``call()`` on a daemon thread; its result or error once it ended."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: list[Any] = []
        self.error: list[BaseException] = []

        def run() -> None:
            try:
                self.result.append(call())
            except BaseException as error:  # reported to the test
                self.error.append(error)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finished(self, timeout: float) -> bool:
        self.thread.join(timeout)
        if self.error:
            raise self.error[0]
        return not self.thread.is_alive()


def test_an_admission_runs_beside_a_lease_unit_in_flight(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """While a lease unit holds the lease gate shared and its lease row locked, another request is admitted: an
    admission takes only the admission gate, and no lease row."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "starting", "held", now=1_000)
    enqueue(plane, "next", agent_id="agent-b", now=1_010)
    with holding(database_url, f"SELECT pg_advisory_xact_lock_shared({LEASE_LOCK_KEY})") as lease_unit:
        lease_unit.execute(text("SELECT 1 FROM leases WHERE lease_id = :id FOR UPDATE"), {"id": lease.lease_id})
        admission = Running(lambda: plane.admit_request("next", 1_020, "owner-b"))
        assert admission.finished(FINISHES_WITHIN_S), "the admission waited for the lease unit"
    assert admission.result[0] is not None
    assert admission.result[0].request_id == "next"


def test_a_lease_step_commits_only_after_an_admission_in_flight_and_numbers_its_events_after_it(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """While an admission holds the admission gate, a lease step runs its statements but does not commit; once the
    admission commits, the step commits, and its journal event's sequence number is above the admission's."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "dispatch_intent", "held", now=1_000)
    step = None
    try:
        with holding(database_url, f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})") as admission:
            admitted_seq = int(admission.execute(_EVENT, {"hmac": "a" * 64}).scalar_one())
            step = Running(lambda: plane.mark_active(lease, 1_010))
            assert not step.finished(STILL_WAITING_AFTER_S), "the lease step committed beside an admission"
            assert plane.get_request("held").state == "dispatch_intent", "nothing of the step is visible yet"
            admission.commit()
        assert step.finished(FINISHES_WITHIN_S)
    finally:
        if step is not None:
            step.thread.join(FINISHES_WITHIN_S)
    assert plane.get_request("held").state == "active"
    with pg_engine(database_url).connect() as connection:
        step_seq = connection.execute(
            text("SELECT max(event_seq) FROM events WHERE kind = 'request_active'")
        ).scalar_one()
    assert step_seq > admitted_seq


@pytest.mark.parametrize("step", ["starting", "dispatch intent"])
def test_a_lease_step_that_changes_no_count_commits_beside_an_admission_in_flight(
    make_plane: Callable[..., AdmissionPlane], database_url: str, step: str
) -> None:
    """A start with no start interval and a dispatch intent keep the lease in the start window and change nothing
    admission counts: they commit while an admission holds the admission gate (``Tx.count_neutral``)."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "admitted" if step == "starting" else "starting", "held", now=1_000)
    calls: dict[str, Callable[[], Any]] = {
        "starting": lambda: plane.mark_starting(lease, 1_010),
        "dispatch intent": lambda: plane.commit_dispatch_intent(dispatch_record(plane, lease)),
    }
    with holding(database_url, f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})"):
        running = Running(calls[step])
        assert running.finished(FINISHES_WITHIN_S), f"the {step} waited for the admission"
    request = plane.get_request("held")
    assert request is not None
    assert request.state == ("starting" if step == "starting" else "dispatch_intent")


@pytest.mark.parametrize(
    ("gate", "operation"),
    [
        pytest.param(f"SELECT pg_advisory_xact_lock_shared({LEASE_LOCK_KEY})", "pause", id="exclusive-after-lease"),
        pytest.param(f"SELECT pg_advisory_xact_lock_shared({LEASE_LOCK_KEY})", "journal", id="journal-after-lease"),
        pytest.param(
            f"SELECT pg_advisory_xact_lock_shared({ADVISORY_LOCK_KEY})", "journal", id="journal-after-enqueue"
        ),
        pytest.param(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})", "enqueue", id="enqueue-after-admission"),
        pytest.param(
            f"SELECT pg_advisory_xact_lock_shared({ADVISORY_LOCK_KEY})", "admit", id="admission-after-enqueue"
        ),
    ],
)
def test_units_that_must_not_overlap_wait_for_each_other(
    make_plane: Callable[..., AdmissionPlane], database_url: str, gate: str, operation: str
) -> None:
    """A pause (``Gate.EXCLUSIVE``) waits for a lease unit in flight; a journal read waits for any writer in flight
    (one holding the lease gate, or the admission gate); an enqueue waits for an admission in flight; an admission
    waits for an enqueue in flight. Each goes through once the other unit ends."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "queued", agent_id="agent-q", now=1_000)
    calls: dict[str, Callable[[], Any]] = {
        "pause": lambda: plane.pause(now=1_010),
        "enqueue": lambda: enqueue(plane, "another", agent_id="agent-b", now=1_010),
        "admit": lambda: plane.admit_request("queued", 1_010, "owner-q"),
        "journal": lambda: plane.read_sanitized_events(limit=10),
    }
    running = None
    try:
        with holding(database_url, gate):
            running = Running(calls[operation])
            assert not running.finished(STILL_WAITING_AFTER_S), f"{operation} did not wait for the unit in flight"
        assert running.finished(FINISHES_WITHIN_S), f"{operation} never went through"
    finally:
        if running is not None:
            running.thread.join(FINISHES_WITHIN_S)


def test_a_start_the_window_proves_commits_only_after_an_exact_starter_in_flight(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """With the start window within the start limit and no interval, a start needs no count and takes the start lock
    shared only in its commit's round trip: while an exact starter holds it exclusively (between its count and its
    commit), the start runs its statements but does not commit; once the holder ends, it commits."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "admitted", "held", now=1_000)
    start = None
    try:
        with holding(database_url, f"SELECT pg_advisory_xact_lock({START_LOCK_KEY})"):
            start = Running(lambda: plane.mark_starting(lease, 1_010))
            assert not start.finished(STILL_WAITING_AFTER_S), "a start committed while an exact starter counted"
            assert plane.get_request("held").state == "admitted", "nothing of the start is visible yet"
        assert start.finished(FINISHES_WITHIN_S)
    finally:
        if start is not None:
            start.thread.join(FINISHES_WITHIN_S)
    assert plane.get_request("held").state == "starting"


def test_a_start_whose_window_exceeds_a_lowered_limit_waits_for_starts_in_flight_then_counts(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """Two leases admitted under two starts, then a connector whose policy allows one: the window no longer proves
    the limit, so its start takes the start lock exclusively, which waits for a start in flight holding it shared,
    and then counts exactly: the first start is accepted, the second refused."""
    roomy = make_plane(policy=Policy(8, 2, 0, 1_800_000, 30_000))
    first = lease_in_phase(roomy, "admitted", "first", now=1_000)
    second = lease_in_phase(roomy, "admitted", "second", now=1_010, agent_id="agent-b")
    strict = make_plane(policy=Policy(8, 1, 0, 1_800_000, 30_000))
    start = None
    try:
        with holding(database_url, f"SELECT pg_advisory_xact_lock_shared({START_LOCK_KEY})"):
            start = Running(lambda: strict.mark_starting(first, 1_020))
            assert not start.finished(STILL_WAITING_AFTER_S), "an exact start did not wait for a start in flight"
        assert start.finished(FINISHES_WITHIN_S)
    finally:
        if start is not None:
            start.thread.join(FINISHES_WITHIN_S)
    assert strict.get_request("first").state == "starting"
    with pytest.raises(AdmissionStateError, match="concurrent start limit reached"):
        strict.mark_starting(second, 1_030)
    assert strict.get_request("second").state == "admitted"


@pytest.mark.parametrize("step", ["active", "completion"])
def test_a_lease_unit_sent_whole_takes_the_admission_gate_only_after_its_lease_row(
    make_plane: Callable[..., AdmissionPlane], database_url: str, step: str
) -> None:
    """A lease unit sent whole with its commit (given the ``AdmittedLease``) takes its locks in the order every lease
    unit does: its lease row first, the admission gate after it. While another transaction holds the lease row,
    the unit waits for the row holding no admission gate, so an admission waiting for the gate behind it (and a
    lease unit of the same lease committing under the gate) is not held up by it; once the row is free, it
    commits."""
    plane = make_plane(policy=ROOMY)
    lease = lease_in_phase(plane, "dispatch_intent" if step == "active" else "active", "held", now=1_000)
    gate = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
        f" AND ((classid::bigint << 32) | objid::bigint) = {ADVISORY_LOCK_KEY}"
    )
    running = None
    try:
        with holding(database_url, f"SELECT 1 FROM leases WHERE lease_id = '{lease.lease_id}' FOR UPDATE") as row:
            if step == "active":
                running = Running(lambda: plane.mark_active(lease, 1_010))
            else:
                running = Running(lambda: plane.complete_live_turn(lease, 1_010, LiveTurnCompletion("completed")))
            assert not running.finished(STILL_WAITING_AFTER_S), "the unit did not wait for its lease row"
            assert row.execute(text(gate)).scalar_one() == 0, "the unit holds the admission gate while it waits"
            row.rollback()
        assert running.finished(FINISHES_WITHIN_S)
    finally:
        if running is not None:
            running.thread.join(FINISHES_WITHIN_S)
    assert plane.get_request("held").state == ("active" if step == "active" else "completed")
