"""SQLite: a wait right after an enqueue whose admission (``admit_as``) admitted nothing starts from what that
enqueue found under the writer gate (``PlaneContext.wait_hint``) instead of a look of its own.

Real SQLite files; the waits run with a ``sleep`` hook that frees the seat from inside the wait (as another
connector would between two of the waiter's steps), so each test knows exactly what happened when.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from planes import ONE_SEAT, Clock, activate, enqueue

from admission_plane import AdmissionPlane, LiveTurnCompletion
from admission_plane.service import _waiting
from admission_plane.service._wake import Wake
from admission_plane.store.doorbell import Chimes

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request of every admission attempt (look, then write if the look says so) the wait makes."""
    made: list[str] = []
    attempt = _waiting.admit_request

    def counted(ctx: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        made.append(request_id)
        return attempt(ctx, request_id, *args, **kwargs)

    monkeypatch.setattr(_waiting, "admit_request", counted)
    return made


def _one_seat_taken(plane: AdmissionPlane) -> Any:
    """``held`` admitted and active in the only seat."""
    owner = plane.owner_identity.owner_instance_id
    lease = enqueue(plane, "held", "agent-a", admit_as=owner).admitted
    if lease is None:  # the connector's first request: its record is written, the admission takes a unit of its own
        lease = plane.admit_request("held", 1_000, owner)
    assert lease is not None
    activate(plane, lease, 1_000)
    return lease


def _freeing(plane: AdmissionPlane, lease: Any, sleeps: list[float]) -> Callable[[float], None]:
    """A ``sleep`` that completes ``lease`` (freeing the seat) at its first call."""

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:
            plane.complete_live_turn(lease, 2_000, LiveTurnCompletion("completed"))

    return sleep


@SQLITE_ONLY
def test_a_refused_enqueue_leaves_its_wait_the_look_it_made_under_the_gate(make_plane: Any, looks: list[str]) -> None:
    """The refused enqueue records what a look would answer (a full seat: wait for a freed seat) with the doorbell
    read under the gate; the wait takes it, so its only attempt is the one after the seat was freed."""
    plane = make_plane(policy=ONE_SEAT, clock=Clock(1_500))
    held = _one_seat_taken(plane)
    owner = plane.owner_identity.owner_instance_id
    assert enqueue(plane, "waiting", "agent-b", admit_as=owner).admitted is None
    hint = plane._ctx.wait_hint
    assert hint is not None
    assert (hint.request_id, hint.owner_instance_id) == ("waiting", owner)
    assert hint.wake == Wake(queue=1, seats=True)
    assert isinstance(hint.seen, Chimes)
    sleeps: list[float] = []
    lease = plane.wait_for_admission("waiting", owner, sleep=_freeing(plane, held, sleeps))
    assert lease is not None
    assert lease.request_id == "waiting"
    assert looks == ["waiting"]  # without the hint: a look first, then the one after the ring
    assert len(sleeps) == 1
    assert plane._ctx.wait_hint is None


@SQLITE_ONLY
def test_a_change_between_the_enqueue_and_its_wait_is_not_missed(make_plane: Any, looks: list[str]) -> None:
    """The seat is freed after the refused enqueue and before the wait begins: the counters moved past the hint's,
    so the wait's first doorbell read sees the ring and it is admitted after one step, not after the fallback."""
    plane = make_plane(policy=ONE_SEAT, clock=Clock(1_500))
    held = _one_seat_taken(plane)
    owner = plane.owner_identity.owner_instance_id
    assert enqueue(plane, "waiting", "agent-b", admit_as=owner).admitted is None
    plane.complete_live_turn(held, 2_000, LiveTurnCompletion("completed"))
    sleeps: list[float] = []
    lease = plane.wait_for_admission("waiting", owner, sleep=sleeps.append, fallback_ms=60_000)
    assert lease is not None
    assert looks == ["waiting"]
    assert len(sleeps) == 1


@SQLITE_ONLY
def test_a_hint_serves_only_its_own_request_and_owner(make_plane: Any, looks: list[str]) -> None:
    """A wait for another request (or as another owner) ignores the hint and looks first; the hint is gone after."""
    plane = make_plane(policy=ONE_SEAT, clock=Clock(1_500))
    held = _one_seat_taken(plane)
    owner = plane.owner_identity.owner_instance_id
    assert enqueue(plane, "first", "agent-b", admit_as=owner).admitted is None
    assert enqueue(plane, "second", "agent-c", admit_as=owner).admitted is None
    hint = plane._ctx.wait_hint
    assert hint is not None
    assert hint.request_id == "second"  # the last enqueue's
    sleeps: list[float] = []
    lease = plane.wait_for_admission("first", owner, sleep=_freeing(plane, held, sleeps))
    assert lease is not None
    assert lease.request_id == "first"
    assert looks == ["first", "first"]  # a look of its own first
    assert plane._ctx.wait_hint is None


@SQLITE_ONLY
def test_an_enqueue_that_admits_drops_the_hint(make_plane: Any) -> None:
    """Admitted at once: nothing to wait for; the hint a refused enqueue left before is dropped."""
    plane = make_plane(policy=ONE_SEAT, clock=Clock(1_500))
    owner = plane.owner_identity.owner_instance_id
    held = _one_seat_taken(plane)
    assert enqueue(plane, "refused", "agent-b", admit_as=owner).admitted is None
    assert plane._ctx.wait_hint is not None
    plane.cancel_queued("refused", 1_500)
    plane.complete_live_turn(held, 2_000, LiveTurnCompletion("completed"))
    assert enqueue(plane, "admitted", "agent-c", now=3_000, admit_as=owner).admitted is not None
    assert plane._ctx.wait_hint is None
