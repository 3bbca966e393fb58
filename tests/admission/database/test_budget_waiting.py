"""Waiting for a budget window (issue 14): ``wait_for_admission`` of a request held back only by a budget sleeps
until the window frees (the look's ``Wake.at``) instead of looking again every few milliseconds, and looks at once
when a freed seat or a revision may let it in earlier.

Every test runs on an SQLite file and on PostgreSQL, with a test clock: between looks the waiter only reads the
doorbell's counters (on PostgreSQL the listener is made ready first, so the waiter uses it from its first look).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from planes import Clock, PlaneFactory, enqueue

from admission_plane import AdmissionPlane, AdmittedLease, Budget, Policy
from admission_plane.service import _admission, _waiting
from admission_plane.store.doorbell import ListeningDoorbell

OWNER = "owner-a"
MINUTE = 60_000
#: Eight seats and starts, no start interval: only the budget holds the waiter back.
ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)
#: A live revision must pass the durable row's bounds, which require a start interval of at least 2 s.
LIVE = Policy(8, 8, 2_000, 1_800_000, 30_000)
#: More looks than this means the waiter polls: the test stops it.
MAX_LOOKS = 20


def put(plane: AdmissionPlane, request_id: str, now: int, estimate: int | None = None) -> None:
    """Enqueue ``request_id`` for ``p1``/``m1`` (its own agent and session) with ``estimate`` tokens."""
    enqueue(
        plane,
        request_id,
        agent_id=f"agent-{request_id}",
        session_id=f"s-{request_id}",
        provider="p1",
        model="m1",
        now=now,
        estimated_tokens=estimate,
    )


def admitted(plane: AdmissionPlane, now: int) -> AdmittedLease:
    """Admit the rule's choice at ``now`` (fails the test if nothing is admitted)."""
    lease = plane.admit_next(now, OWNER)
    assert lease is not None, "expected an admission"
    return lease


def record_looks(plane: AdmissionPlane, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The plane clock's time at every admission look the plane runs (the waiter is stopped past MAX_LOOKS).

    The waiter's jitter is taken out, so with the default initial delay of 1 ms it reads the doorbell at every
    millisecond of the test clock, and the first look at or after a time is exactly at that time.
    """
    looks: list[int] = []
    monkeypatch.setattr(_waiting, "_jitter", lambda: 1.0)
    original = _admission.look

    def look(ctx: Any, tx: Any, request_id: str, *args: Any, **options: Any) -> Any:
        if ctx is plane._ctx:
            looks.append(clock.now)
            assert len(looks) <= MAX_LOOKS, "the waiter polls instead of sleeping until the window frees"
        return original(ctx, tx, request_id, *args, **options)

    monkeypatch.setattr(_admission, "look", look)
    return looks


def listen(plane: AdmissionPlane) -> None:
    """On PostgreSQL, make the plane's doorbell listen for the rest of the test and wait until it does (with a test
    sleep the waiter would poll until then)."""
    doorbell = plane._ctx.doorbell
    if isinstance(doorbell, ListeningDoorbell):
        doorbell.interest()  # never released: the plane's close stops the listener
        assert doorbell.wait_ready(10.0) is not None, "the PostgreSQL doorbell never listened"
    else:
        assert doorbell is not None, "an SQLite file plane has a doorbell"


def wait(
    plane: AdmissionPlane,
    clock: Clock,
    request_id: str,
    *,
    at_sleep: int | None = None,
    action: Callable[[], object] | None = None,
) -> tuple[AdmittedLease, list[int]]:
    """Wait for ``request_id`` (fallback and timeout ten minutes), running ``action`` at sleep number ``at_sleep``
    and, on PostgreSQL, until the doorbell heard the ring it made; the lease and the clock after every sleep."""
    times: list[int] = []
    doorbell = plane._ctx.doorbell

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        times.append(clock.now)
        if action is not None and len(times) == at_sleep:
            seen = doorbell.read() if doorbell is not None else None
            action()
            if isinstance(doorbell, ListeningDoorbell) and seen is not None:
                doorbell.wait_past(seen, 10.0)  # the notification arrives on the listener's thread

    lease = plane.wait_for_admission(request_id, "me", sleep=sleep, fallback_ms=10 * MINUTE, timeout_ms=10 * MINUTE)
    assert lease is not None, "the waiter was never admitted"
    assert lease.request_id == request_id
    return lease, times


def test_a_waiter_held_back_by_a_request_window_sleeps_until_the_first_charge_leaves_it(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held back by a one-request-per-minute budget whose charge was made at 1000, the waiter looks once, sleeps on
    the doorbell until its clock reaches 61000 (the charge leaves the window), and is admitted by the first look at
    or after it: two looks in all, not one per back-off step."""
    clock = Clock(now=2_000)
    plane = make_plane(policy=attrs.evolve(ROOMY, budgets=(Budget("p1", "m1", max_requests=1),)), clock=clock)
    put(plane, "held", 10)
    admitted(plane, 1_000)
    put(plane, "mine", 20)
    listen(plane)
    looks = record_looks(plane, clock, monkeypatch)
    _, times = wait(plane, clock, "mine")
    free = 1_000 + MINUTE
    assert looks == [2_000, free], "one look, then one exactly when the window frees: no polling"
    assert times[-1] == free
    assert len(times) == free - 2_000, "between the looks only doorbell reads, one per millisecond"
    assert plane.budget_status(now=clock.now)[0].requests == 1, "the held turn left; the waiter's charge counts"


def test_a_waiter_needing_tokens_sleeps_until_enough_charges_leave_the_window(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 100 tokens charged at 1000 and 800 at 2000 of a 1000-token minute, a waiter estimating 300 does not fit
    when the first charge leaves (800 + 300 > 1000) but does when the second does: it sleeps until 62000."""
    clock = Clock(now=3_000)
    plane = make_plane(policy=attrs.evolve(ROOMY, budgets=(Budget("p1", "m1", max_tokens=1_000),)), clock=clock)
    put(plane, "small", 10, estimate=100)
    put(plane, "large", 11, estimate=800)
    admitted(plane, 1_000)
    admitted(plane, 2_000)
    put(plane, "mine", 20, estimate=300)
    listen(plane)
    looks = record_looks(plane, clock, monkeypatch)
    wait(plane, clock, "mine")
    free = 2_000 + MINUTE
    assert looks == [3_000, free], "not at 61000, when the first charge leaves"
    assert plane.budget_status(now=clock.now)[0].reserved_tokens == 300


def test_a_refunded_reservation_wakes_the_waiter_before_the_window_frees(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn holding the only request of the minute is abandoned before its prompt: the refund frees a seat,
    which rings the doorbell, and the waiter looks again at once and is admitted long before the window's end."""
    clock = Clock(now=2_000)
    plane = make_plane(policy=attrs.evolve(ROOMY, budgets=(Budget("p1", "m1", max_requests=1),)), clock=clock)
    put(plane, "held", 10)
    held = admitted(plane, 1_000)
    put(plane, "mine", 20)
    listen(plane)
    looks = record_looks(plane, clock, monkeypatch)
    _, times = wait(
        plane, clock, "mine", at_sleep=5, action=lambda: plane.abandon_before_prompt(held, clock.now, "cancelled")
    )
    assert len(times) == 5, "looked again right after the ring"
    assert looks == [2_000, times[4]]
    assert clock.now < 1_000 + MINUTE


def test_a_revision_removing_the_budget_wakes_the_waiter(
    make_plane: PlaneFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live revision without the budget rings for everyone: the waiter held back by the budget looks again at once
    and is admitted, long before the window would have freed it."""
    clock = Clock(now=5_000)  # past the start interval of the held turn
    plane = make_plane(policy=attrs.evolve(LIVE, budgets=(Budget("p1", "m1", max_requests=1),)), clock=clock)
    put(plane, "held", 10)
    admitted(plane, 1_000)
    put(plane, "mine", 20)
    listen(plane)
    looks = record_looks(plane, clock, monkeypatch)
    _, times = wait(plane, clock, "mine", at_sleep=5, action=lambda: plane.set_policy(LIVE, now=clock.now))
    assert len(times) == 5
    assert looks == [5_000, times[4]]
    assert plane.budget_status(now=clock.now) == ()
