"""wait_for_admission(start=True): a waiter's admission starts its lease in the same transaction where it can.

On SQLite every writer waits for one write lock, so a waiter that is admitted and started in one
transaction costs one writing unit (and one durable commit) fewer. The start is exactly
``mark_starting``'s: where that would refuse, the admission commits alone and says so
(``lease.starting`` false). PostgreSQL never starts in an admission (its admissions and starts take
different gates), and says so the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from journal_replay import read_journal, replay
from planes import Clock, enqueue

from admission_plane import (
    AdmissionPlane,
    AdmissionStateError,
    AdmittedLease,
    DispatchRecord,
    InvalidInputError,
    LiveTurnCompletion,
    Policy,
    RequestState,
)
from admission_plane.evidence import capture
from admission_plane.states import EventKind

TWO_SEATS = Policy(2, 2, 0, 1_800_000, 30_000)


def sqlite(plane: AdmissionPlane) -> bool:
    return plane.engine.dialect.name == "sqlite"


def kinds_of(plane: AdmissionPlane) -> list[str]:
    return [str(event.kind) for event in read_journal(plane)]


def test_a_started_admission_moves_the_lease_to_starting_in_one_transaction(
    make_plane: Callable[..., AdmissionPlane],
) -> None:
    """SQLite: the lease comes back ``starting`` (and is), the journal holds both moves, and the turn goes on
    from there; PostgreSQL: it comes back ``admitted`` (and is), for ``mark_starting`` to start."""
    clock = Clock()
    plane = make_plane(policy=TWO_SEATS, clock=clock)
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "r1", now=clock.now)
    lease = plane.wait_for_admission("r1", owner, sleep=clock.sleep, start=True)
    assert lease is not None
    assert lease.starting is sqlite(plane)
    expected = RequestState.STARTING if sqlite(plane) else RequestState.ADMITTED
    assert plane.get_request("r1").state is expected
    if sqlite(plane):
        assert kinds_of(plane)[-2:] == [EventKind.REQUEST_ADMITTED, EventKind.REQUEST_STARTING]
        with pytest.raises(AdmissionStateError, match="lease is not admitted"):
            plane.mark_starting(lease, clock.now)
    else:
        plane.mark_starting(lease, clock.now)
    record = DispatchRecord(
        request_id="r1",
        lease_id=lease.lease_id,
        generation=lease.generation,
        owner_instance_id=owner,
        connector=plane.owner_identity,
        child=capture(os.getpid()),
        prompt_channel="stdin",
    )
    assert plane.commit_dispatch_intent(record).ok
    plane.mark_active(lease, clock.now)
    plane.complete_live_turn(lease, clock.now, LiveTurnCompletion("completed"))
    assert plane.get_request("r1").state is RequestState.COMPLETED
    result = replay(read_journal(plane))
    assert result.discontinuities == ()
    assert result.admitted_twice == ()
    assert result.max_seat_holders == 1


def test_without_start_the_lease_stays_admitted(make_plane: Callable[..., AdmissionPlane]) -> None:
    """The default admits only, on both dialects."""
    clock = Clock()
    plane = make_plane(policy=TWO_SEATS, clock=clock)
    enqueue(plane, "r1", now=clock.now)
    lease = plane.wait_for_admission("r1", "owner-1", sleep=clock.sleep)
    assert lease is not None
    assert not lease.starting
    assert plane.get_request("r1").state is RequestState.ADMITTED


@pytest.mark.sqlite_only("PostgreSQL never starts in an admission: the first test shows it")
def test_a_start_the_limit_refuses_leaves_the_admission_alone(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the start's check refuses, the admission commits unstarted and the connector starts it itself.

    Admission never admits past the start limit or inside the interval, so the check refuses only what a
    policy could change between the two reads of one transaction (nothing, today): the refusal is made by
    wrapping the real check, which is seen to run and to allow the start."""
    clock = Clock()
    plane = make_plane(policy=Policy(2, 2, 0, 1_800_000, 30_000), clock=clock)
    enqueue(plane, "holder", now=clock.now, agent_id="agent-h")
    holder = plane.admit_request("holder", clock.now, "owner-0")
    assert holder is not None
    plane.mark_starting(holder, clock.now)
    enqueue(plane, "r1", now=clock.now)
    from admission_plane.service import _lifecycle

    real = _lifecycle._start_refusal
    seen: list[str | None] = []

    def refusing(*args: object, **kwargs: object) -> str | None:
        seen.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return "concurrent start limit reached"

    monkeypatch.setattr(_lifecycle, "_start_refusal", refusing)
    lease = plane.wait_for_admission("r1", "owner-1", sleep=clock.sleep, start=True)
    monkeypatch.undo()
    assert seen == [None], "the real check ran once and would have allowed it"
    assert lease is not None
    assert not lease.starting
    assert plane.get_request("r1").state is RequestState.ADMITTED
    assert kinds_of(plane)[-1] != EventKind.REQUEST_STARTING
    plane.mark_starting(lease, clock.now)
    assert plane.get_request("r1").state is RequestState.STARTING


def test_a_start_interval_is_honoured_by_the_start_in_the_admission(make_plane: Callable[..., AdmissionPlane]) -> None:
    """With a start interval the admission waits for it (its capacity check), and the start it makes is
    stamped: a second lease admitted and started at once would break the interval, so it waits too."""
    clock = Clock()
    plane = make_plane(policy=Policy(3, 3, 1_000, 1_800_000, 30_000), clock=clock)
    enqueue(plane, "r1", now=clock.now, agent_id="agent-1")
    enqueue(plane, "r2", now=clock.now, agent_id="agent-2")
    first = plane.wait_for_admission("r1", "owner-1", sleep=clock.sleep, start=True)
    assert first is not None
    if not first.starting:
        plane.mark_starting(first, clock.now)
    started_at = clock.now
    second = plane.wait_for_admission("r2", "owner-2", sleep=clock.sleep, start=True)
    assert second is not None
    assert clock.now >= started_at + 1_000, "the second admission waited out the interval"
    assert second.starting is sqlite(plane)


@pytest.mark.parametrize("bad", [1, "yes", None, 0.0])
def test_a_start_that_is_not_a_bool_is_refused_before_any_look(
    make_plane: Callable[..., AdmissionPlane], bad: object
) -> None:
    """A misplaced argument is refused, not guessed, and changes nothing."""
    clock = Clock()
    plane = make_plane(policy=TWO_SEATS, clock=clock)
    enqueue(plane, "r1", now=clock.now)
    with pytest.raises(InvalidInputError, match="admission wait start must be True or False"):
        plane.wait_for_admission("r1", "owner-1", sleep=clock.sleep, start=bad)  # type: ignore[arg-type]
    assert plane.get_request("r1").state is RequestState.QUEUED


def test_starting_takes_no_part_in_a_leases_equality() -> None:
    """The flag says what the lease was when returned; the lease is its fence and request."""
    assert AdmittedLease("l", "r", 1, "o", starting=True) == AdmittedLease("l", "r", 1, "o")
    assert AdmittedLease("l", "r", 1, "o", starting=True).starting
    assert not AdmittedLease("l", "r", 1, "o").starting
