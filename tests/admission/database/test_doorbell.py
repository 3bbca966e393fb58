"""The admission doorbell: which writes ring it, and how waiting connectors use it to look less often."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from dbutil import POSTGRES_ONLY, pg_engine
from planes import ONE_SEAT, Clock, admit, enqueue, lease_in_phase
from sqlalchemy import text

from admission_plane import AdmissionPlane, InvalidInputError, KeyLimit, LiveTurnCompletion, Policy, RequestState
from admission_plane.service import DOORBELL_FALLBACK_MS, _admission, wall_clock_ms
from admission_plane.service._wake import Wake as _Wake
from admission_plane.store.advisory import LISTENING_KEY
from admission_plane.store.doorbell import EVERYONE_STEP, Bell, Chimes, Doorbell, ListeningDoorbell, ring

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


# --- the counters --------------------------------------------------------------------------------


def test_ring_adds_one_per_bell_and_everyone_adds_to_all_three(tmp_path: Path) -> None:
    """QUEUE/SEATS/STARTS each add one to their counter per ring; EVERYONE adds 2**32 to all three."""
    path = str(tmp_path / "gate")
    bell = Doorbell.open(path)
    assert bell is not None
    assert bell.read() == Chimes(0, 0, 0), "a new (empty) gate file reads as zeros"
    fd = os.open(path, os.O_RDWR)
    try:
        ring(fd, Chimes.of(Bell.QUEUE))
        ring(fd, Chimes.of(Bell.SEATS | Bell.STARTS))
        ring(fd, Chimes.of(0))
        assert bell.read() == Chimes(1, 1, 1)
        ring(fd, Chimes.of(Bell.EVERYONE | Bell.QUEUE).plus(Chimes.of(Bell.QUEUE)))
        assert bell.read() == Chimes(EVERYONE_STEP + 3, EVERYONE_STEP + 1, EVERYONE_STEP + 1)
    finally:
        os.close(fd)
        bell.close()
    assert bell.read() is None, "a closed doorbell reads nothing"
    bell.close()  # idempotent


def test_counters_wrap_around_at_64_bits(tmp_path: Path) -> None:
    """A counter at 2**64 - 1 wraps to 0, and a waiter still sees the change."""
    path = tmp_path / "gate"
    path.write_bytes((2**64 - 1).to_bytes(8, "little") * 3)
    fd = os.open(path, os.O_RDWR)
    try:
        ring(fd, Chimes.of(Bell.QUEUE))
    finally:
        os.close(fd)
    bell = Doorbell.open(str(path))
    assert bell is not None
    seen = Chimes(2**64 - 1, 2**64 - 1, 2**64 - 1)
    assert bell.read() == Chimes(0, 2**64 - 1, 2**64 - 1)
    assert _Wake(queue=1).rung(seen, bell.read())  # type: ignore[arg-type]
    bell.close()


@pytest.mark.parametrize(
    ("payload", "delta"),
    [
        ("1,0,0", Chimes(1, 0, 0)),
        ("2,1,1", Chimes(2, 1, 1)),
        ("", Chimes.of(Bell.EVERYONE)),
        ("1,2", Chimes.of(Bell.EVERYONE)),
        ("x,0,0", Chimes.of(Bell.EVERYONE)),
    ],
)
def test_a_notification_payload_is_a_delta_and_garbage_wakes_everyone(payload: str, delta: Chimes) -> None:
    """PostgreSQL payloads carry the three increments; one that does not parse counts as a change for everyone."""
    assert Chimes.from_payload(payload) == delta
    assert Chimes.from_payload(delta.payload()) == delta


def test_no_doorbell_without_a_file() -> None:
    """No gate file (PostgreSQL, an in-memory database) or an unopenable one means no doorbell."""
    assert Doorbell.open(None) is None
    assert Doorbell.open("/nonexistent-directory/gate") is None


@pytest.mark.parametrize(
    ("wake", "current", "rung"),
    [
        (_Wake(queue=2), Chimes(11, 5, 5), False),
        (_Wake(queue=2), Chimes(12, 5, 5), True),
        (_Wake(queue=2), Chimes(10, 9, 9), False),
        (_Wake(queue=1, seats=True), Chimes(10, 6, 5), True),
        (_Wake(queue=1, seats=True), Chimes(10, 5, 6), False),
        (_Wake(queue=1, starts=True), Chimes(10, 5, 6), True),
        (_Wake(at=99), Chimes(50, 50, 50), False),
        (_Wake(), Chimes(10 + EVERYONE_STEP, 5 + EVERYONE_STEP, 5 + EVERYONE_STEP), True),
    ],
)
def test_a_waiter_wakes_only_for_what_it_waits_for(wake: _Wake, current: Chimes, rung: bool) -> None:
    """From counters (10, 5, 5): k departures, a freed seat or start slot, or a change for everyone."""
    assert wake.rung(Chimes(10, 5, 5), current) is rung


# --- what rings ------------------------------------------------------------------------------------


def chimes(plane: AdmissionPlane) -> Chimes:
    reading = plane._ctx.doorbell.read() if plane._ctx.doorbell is not None else None
    assert reading is not None, "an SQLite file plane has a doorbell"
    return reading


def moved(before: Chimes, after: Chimes) -> tuple[int, int, int]:
    return after.queue - before.queue, after.seats - before.seats, after.starts - before.starts


@SQLITE_ONLY
def test_each_operation_rings_what_it_changed_for_waiters(plane: AdmissionPlane) -> None:
    """Admission and cancellation ring QUEUE, leaving the start window rings STARTS, a freed seat SEATS and
    STARTS, a cooldown everyone; enqueueing, starting and the dispatch intent ring nothing."""
    steps: list[tuple[str, Callable[[], Any], tuple[int, int, int]]] = []
    state: dict[str, Any] = {}
    steps.append(("enqueue", lambda: enqueue(plane, "r1"), (0, 0, 0)))
    steps.append(("admit", lambda: state.setdefault("lease", admit(plane, 1_001)), (1, 0, 0)))
    steps.append(("starting", lambda: plane.mark_starting(state["lease"], 1_002), (0, 0, 0)))
    steps.append(("intent", lambda: plane.mark_dispatch_intent(state["lease"], 1_003), (0, 0, 0)))
    steps.append(("active", lambda: plane.mark_active(state["lease"], 1_004), (0, 0, 1)))
    steps.append(
        (
            "complete",
            lambda: plane.complete_live_turn(state["lease"], 1_005, LiveTurnCompletion("completed")),
            (0, 1, 1),
        )
    )
    steps.append(("enqueue r2", lambda: enqueue(plane, "r2", now=1_006), (0, 0, 0)))
    steps.append(("cancel", lambda: plane.cancel_queued("r2", 1_007), (1, 0, 0)))
    steps.append(
        (
            "cooldown",
            lambda: plane.set_capacity_cooldown("p", "m", 90_000, 1_008),
            (EVERYONE_STEP, EVERYONE_STEP, EVERYONE_STEP),
        )
    )
    for name, step, expected in steps:
        before = chimes(plane)
        step()
        assert moved(before, chimes(plane)) == expected, name


@SQLITE_ONLY
def test_queue_timeouts_ring_queue_once_per_request(make_plane: Callable[..., AdmissionPlane]) -> None:
    """Each request timed out by an admission's transaction counts as one departure, even in one transaction."""
    plane = make_plane(policy=Policy(1, 1, 0, 1_000, 30_000))
    enqueue(plane, "old", now=1_000, expires_at=10_000)
    enqueue(plane, "older", agent_id="b", now=999, expires_at=10_000)
    before = chimes(plane)
    assert plane.admit_next(5_000, "owner") is None  # both timed out at about 2 000, nothing else queued
    assert plane.get_request("old").state is RequestState.QUEUE_TIMEOUT
    assert plane.get_request("older").state is RequestState.QUEUE_TIMEOUT
    assert moved(before, chimes(plane)) == (2, 0, 0)


@SQLITE_ONLY
def test_a_refused_operation_rings_nothing(plane: AdmissionPlane) -> None:
    """A transaction that rolls back announces nothing, even if it had asked to ring."""
    lease = lease_in_phase(plane, "admitted")
    before = chimes(plane)
    with pytest.raises(Exception, match="lease is not"):
        plane.mark_active(lease, 2_000)
    assert chimes(plane) == before


# --- waiting with the doorbell --------------------------------------------------------------------------


def count_looks(plane: AdmissionPlane, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the request id of every admission look the plane runs."""
    looks: list[str] = []
    original = _admission.look

    def look(ctx: Any, tx: Any, request_id: str, *args: Any, **options: Any) -> Any:
        if ctx is plane._ctx:
            looks.append(request_id)
        return original(ctx, tx, request_id, *args, **options)

    monkeypatch.setattr(_admission, "look", look)
    return looks


def _wait_behind_two_idle_agents(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch, policy: Policy
) -> list[tuple[str, int]]:
    """Wait for "mine" behind the requests of two idle agents, which another plane admits at the
    third and sixth doorbell read; return every look of the waiting plane as (request, reads so far).

    A fourth agent holds one of the three seats until the sixth read, so there are never seats for
    both requests ahead and "mine" at once (which would admit it beside them at its first look)."""
    clock = Clock()
    plane = make_plane(policy=policy, clock=clock)
    other = make_plane(policy=policy)
    enqueue(plane, "holder", agent_id="h", now=800)
    holder = other.admit_next(850, "other")
    assert holder is not None
    enqueue(plane, "first", agent_id="a", now=900)
    enqueue(plane, "second", agent_id="b", now=901)
    enqueue(plane, "mine", agent_id="c", now=902)
    looks: list[tuple[str, int]] = []
    admitted: list[str] = []
    original_look = _admission.look

    def look(ctx: Any, tx: Any, request_id: str, *args: Any, **options: Any) -> Any:
        if ctx is plane._ctx:
            looks.append((request_id, len(clock.sleeps)))
        return original_look(ctx, tx, request_id, *args, **options)

    monkeypatch.setattr(_admission, "look", look)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) in (3, 6):
            lease = other.admit_next(clock.now, "other")
            assert lease is not None
            admitted.append(lease.request_id)
        if len(clock.sleeps) == 6:
            other.abandon_before_prompt(holder, clock.now, "cancelled")

    lease = plane.wait_for_admission("mine", "me", sleep=sleep)
    assert admitted == ["first", "second"]
    assert lease is not None
    assert lease.request_id == "mine"
    assert len(clock.sleeps) == 6
    return looks


@SQLITE_ONLY
def test_a_waiter_behind_two_idle_agents_looks_again_only_after_two_departures(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between looks it only reads the doorbell; one departure is not enough, the second makes it look and win."""
    looks = _wait_behind_two_idle_agents(make_plane, monkeypatch, Policy(3, 3, 0, 1_800_000, 30_000))
    assert looks == [("mine", 0), ("mine", 6)], "one look at the start, one after the second departure"


@SQLITE_ONLY
def test_with_keyed_limits_a_waiter_behind_others_looks_again_at_each_departure(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a keyed limit one admission may hold back a whole key, so the place in line is no bound: the waiter
    looks once after each departure, and never on a doorbell read that found nothing new."""
    policy = Policy(3, 3, 0, 1_800_000, 30_000, key_limits=(KeyLimit("antigravity", max_active_turns=3),))
    looks = _wait_behind_two_idle_agents(make_plane, monkeypatch, policy)
    assert looks == [("mine", 0), ("mine", 3), ("mine", 6)]


@SQLITE_ONLY
def test_the_first_waiter_takes_a_freed_seat_at_its_next_doorbell_read(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked on a full plane, the head waiter reads the doorbell every initial delay (no back-off) and looks
    again as soon as the seat is freed."""
    clock = Clock()
    plane = make_plane(policy=ONE_SEAT, clock=clock)
    holder = make_plane(policy=ONE_SEAT)
    held = lease_in_phase(holder, "active", "held", now=500)
    enqueue(plane, "mine", agent_id="b", now=900)
    looks = count_looks(plane, monkeypatch)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 20:
            holder.complete_live_turn(held, clock.now, LiveTurnCompletion("completed"))

    lease = plane.wait_for_admission("mine", "me", initial_delay_ms=1.0, sleep=sleep)
    assert lease is not None
    assert lease.request_id == "mine"
    assert looks == ["mine", "mine"]
    assert len(clock.sleeps) == 20
    assert max(clock.sleeps) <= 0.0015 + 1e-9, "the head does not back off"


@SQLITE_ONLY
def test_a_seat_freed_by_a_writer_that_does_not_ring_is_found_by_the_fallback(
    make_plane: Callable[..., AdmissionPlane], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program (here the sqlite3 module) frees the seat without ringing: the waiter looks again after
    DOORBELL_FALLBACK_MS of its clock and is admitted."""
    clock = Clock()
    plane = make_plane(policy=ONE_SEAT, clock=clock)
    lease_in_phase(make_plane(policy=ONE_SEAT), "active", "held", now=500)
    enqueue(plane, "mine", agent_id="b", now=900)
    start = clock.now

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 1:
            with closing(sqlite3.connect(database_url)) as connection, connection:
                connection.execute("DELETE FROM leases")

    looks = count_looks(plane, monkeypatch)
    lease = plane.wait_for_admission("mine", "me", sleep=sleep)
    assert lease is not None
    assert looks == ["mine", "mine"]
    assert DOORBELL_FALLBACK_MS <= clock.now - start <= DOORBELL_FALLBACK_MS + 5


@SQLITE_ONLY
def test_the_fallback_is_configurable_and_must_be_positive(
    make_plane: Callable[..., AdmissionPlane], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fallback_ms`` shortens the unrung wait; zero or a non-integer is invalid input."""
    clock = Clock()
    plane = make_plane(policy=ONE_SEAT, clock=clock)
    lease_in_phase(make_plane(policy=ONE_SEAT), "active", "held", now=500)
    enqueue(plane, "mine", agent_id="b", now=900)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInputError, match="fallback"):
            plane.wait_for_admission("mine", "me", sleep=clock.sleep, fallback_ms=bad)  # type: ignore[arg-type]
    looks = count_looks(plane, monkeypatch)
    start = clock.now
    assert plane.wait_for_admission("mine", "me", sleep=clock.sleep, fallback_ms=20, timeout_ms=100) is None
    assert clock.now - start >= 100
    assert 5 <= len(looks) <= 7, "a look about every 20 ms of the 100 ms wait"


@SQLITE_ONLY
def test_a_waiter_whose_model_cools_down_looks_again_when_the_cooldown_ends(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cooling provider/model: seats are free, but the next look is at the cooldown's end, not before."""
    clock = Clock()
    plane = make_plane(policy=Policy(2, 2, 0, 1_800_000, 30_000), clock=clock)
    enqueue(plane, "mine", agent_id="b", now=901)
    plane.set_capacity_cooldown("antigravity", "model-test", 1_100, 1_000)
    looks = count_looks(plane, monkeypatch)
    lease = plane.wait_for_admission("mine", "me", sleep=clock.sleep)
    assert lease is not None
    assert looks == ["mine", "mine"]
    assert 1_100 <= clock.now <= 1_105


@SQLITE_ONLY
def test_a_waiter_stops_when_its_request_is_cancelled(
    make_plane: Callable[..., AdmissionPlane],
) -> None:
    """A cancellation rings the queue, so a head waiter blocked on seats notices at once and returns None."""
    clock = Clock()
    plane = make_plane(policy=ONE_SEAT, clock=clock)
    lease_in_phase(make_plane(policy=ONE_SEAT), "active", "held", now=500)
    enqueue(plane, "mine", agent_id="b", now=900)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 2:
            plane.cancel_queued("mine", clock.now)

    assert plane.wait_for_admission("mine", "me", sleep=sleep) is None
    assert len(clock.sleeps) == 2


@SQLITE_ONLY
def test_on_wait_is_called_after_every_look_that_did_not_admit(make_plane: Callable[..., AdmissionPlane]) -> None:
    """``on_wait(now)`` sees each unsuccessful look, with the plane's clock."""
    clock = Clock()
    plane = make_plane(policy=ONE_SEAT, clock=clock)
    held = lease_in_phase(make_plane(policy=ONE_SEAT), "active", "held", now=500)
    enqueue(plane, "mine", agent_id="b", now=900)
    calls: list[int] = []

    def on_wait(now: int) -> None:
        calls.append(now)
        if len(calls) == 2:
            plane.complete_live_turn(held, now, LiveTurnCompletion("completed"))

    assert plane.wait_for_admission("mine", "me", sleep=clock.sleep, on_wait=on_wait) is not None
    assert len(calls) == 2
    assert calls[0] < calls[1]


@SQLITE_ONLY
def test_the_start_interval_wait_ends_at_the_interval(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked only by the minimum start interval, the waiter looks again when it has elapsed."""
    clock = Clock(now=2_000)
    policy = Policy(3, 3, 100, 1_800_000, 30_000)
    plane = make_plane(policy=policy, clock=clock)
    first = lease_in_phase(make_plane(policy=policy), "admitted", "first", now=1_990)
    enqueue(plane, "mine", agent_id="b", now=1_995)
    looks = count_looks(plane, monkeypatch)
    lease = plane.wait_for_admission("mine", "me", sleep=clock.sleep)
    assert lease is not None
    assert looks == ["mine", "mine"]
    assert clock.now >= 1_991 + 100, f"admitted only after the interval from the reservation of {first.request_id}"


# --- PostgreSQL: notifications counted by a listening thread ----------------------------------------------


def listening(plane: AdmissionPlane) -> Chimes:
    """Make the plane's listener listen for the rest of the test (an interest never released) and wait (real time,
    at most 5 s) until it does; its counters then."""
    doorbell = plane._ctx.doorbell
    assert isinstance(doorbell, ListeningDoorbell)
    doorbell.interest()
    deadline = time.monotonic() + 5
    while (reading := plane._ctx.doorbell.read() if plane._ctx.doorbell is not None else None) is None:
        assert time.monotonic() < deadline, "the PostgreSQL doorbell never started listening"
        time.sleep(0.005)
    return reading


def next_chimes(plane: AdmissionPlane, before: Chimes) -> Chimes:
    """Wait (real time, at most 5 s) for the listener to count a notification after ``before``."""
    deadline = time.monotonic() + 5
    while chimes(plane) == before:
        assert time.monotonic() < deadline, "no notification arrived"
        time.sleep(0.002)
    time.sleep(0.05)  # let any further notification of the same transaction arrive
    return chimes(plane)


@POSTGRES_ONLY
def test_postgres_writers_notify_and_a_listening_plane_counts(make_plane: Callable[..., AdmissionPlane]) -> None:
    """A commit on one plane is counted by another plane's listener: admission QUEUE, completion SEATS and STARTS."""
    waiter = make_plane()
    writer = make_plane()
    before = listening(waiter)
    enqueue(writer, "r1")
    lease = admit(writer, 1_001)
    after_admission = next_chimes(waiter, before)
    assert moved(before, after_admission) == (1, 0, 0)
    writer.mark_starting(lease, 1_002)
    writer.mark_dispatch_intent(lease, 1_003)
    writer.mark_active(lease, 1_004)
    writer.complete_live_turn(lease, 1_005, LiveTurnCompletion("completed"))
    assert moved(after_admission, next_chimes(waiter, after_admission)) == (0, 1, 2)


@POSTGRES_ONLY
def test_postgres_close_stops_the_listener(make_plane: Callable[..., AdmissionPlane]) -> None:
    """Closing the plane stops its listener thread; the doorbell then reads nothing."""
    plane = make_plane()
    listening(plane)
    doorbell = plane._ctx.doorbell
    plane.close()
    assert doorbell is not None
    assert doorbell.read() is None
    assert doorbell._thread is not None
    assert not doorbell._thread.is_alive()


@POSTGRES_ONLY
def test_a_postgres_waiter_is_woken_by_a_seat_freed_on_another_plane(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter blocked on a full plane tries again when the notification of the freed seat arrives, not on a
    timer (the fallback timer is set to a minute here). Its look said it was the rule's next choice, held back
    by the seat alone (``Wake.first``), so after the ring it goes to the admission without looking again: one
    look in all."""
    waiter = make_plane(policy=ONE_SEAT)
    holder = make_plane(policy=ONE_SEAT)
    held = lease_in_phase(holder, "active", "held", now=500)
    enqueue(waiter, "mine", agent_id="b", now=wall_clock_ms())  # the waiter's clock is the wall clock
    listening(waiter)
    looks = count_looks(waiter, monkeypatch)
    result: list[Any] = []

    def wait() -> None:  # a fallback of a minute: only the notification may wake it
        result.append(waiter.wait_for_admission("mine", "me", timeout_ms=20_000, fallback_ms=60_000))

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    holder.complete_live_turn(held, wall_clock_ms(), LiveTurnCompletion("completed"))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert result[0] is not None
    assert result[0].request_id == "mine"
    assert len(looks) == 1, "one look before the seat was freed; the admission at once after its notification"


@POSTGRES_ONLY
def test_postgres_listener_reconnects_after_losing_its_connection(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """The server ends the listener's session: the doorbell reads nothing meanwhile (waiters poll), then the
    listener reconnects, counts the gap as a change for everyone, and counts notifications again."""
    waiter = make_plane()
    writer = make_plane()
    before = listening(waiter)
    engine = pg_engine(database_url)
    with engine.begin() as connection:
        ended = connection.execute(
            text(f"SELECT count(pg_terminate_backend(pid)) FROM ({LISTENERS}) AS listener"), {"key": LISTENING_KEY}
        ).scalar_one()
    assert ended == 1
    deadline = time.monotonic() + 15
    while (reading := chimes_or_none(waiter)) is None or reading.queue - before.queue < EVERYONE_STEP:
        assert time.monotonic() < deadline, "the listener did not come back"
        time.sleep(0.02)
    enqueue(writer, "r1")
    admit(writer, 1_001)
    assert moved(reading, next_chimes(waiter, reading)) == (1, 0, 0)


def chimes_or_none(plane: AdmissionPlane) -> Chimes | None:
    return plane._ctx.doorbell.read() if plane._ctx.doorbell is not None else None


#: The sessions of this database that hold the listeners' lock (every listening doorbell: its registration).
LISTENERS = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND (classid::bigint << 32 | objid::bigint) = :key"
)


def listening_backends(database_url: str) -> int:
    """Sessions of this database registered as listening on the doorbell (holding the listeners' lock)."""
    engine = pg_engine(database_url)
    with engine.begin() as connection:
        return int(
            connection.execute(
                text(f"SELECT count(*) FROM ({LISTENERS}) AS listener"), {"key": LISTENING_KEY}
            ).scalar_one()
        )


@POSTGRES_ONLY
def test_a_postgres_plane_whose_turns_are_admitted_at_once_never_listens(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """A plane whose waits all end in their first attempt starts no listener: no backend listens for it, so other
    planes' commits wake nothing of it."""
    plane = make_plane()
    for index in range(3):
        enqueue(plane, f"r{index}", agent_id=f"a{index}", now=wall_clock_ms())
        lease = plane.wait_for_admission(f"r{index}", "me", timeout_ms=5_000)
        assert lease is not None
        plane.complete_live_turn(lease_in_phase_of(plane, lease), wall_clock_ms(), LiveTurnCompletion("completed"))
    doorbell = plane._ctx.doorbell
    assert isinstance(doorbell, ListeningDoorbell)
    assert doorbell._thread is None
    assert doorbell.read() is None
    assert listening_backends(database_url) == 0


def lease_in_phase_of(plane: AdmissionPlane, lease: Any) -> Any:
    """Drive an admitted ``lease`` of ``plane`` to ``active``; the lease."""
    for step in (plane.mark_starting, plane.mark_dispatch_intent, plane.mark_active):
        step(lease, wall_clock_ms())
    return lease


@POSTGRES_ONLY
def test_a_postgres_waiter_listens_while_it_waits_and_the_listener_stops_after_the_linger(
    make_plane: Callable[..., AdmissionPlane], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that must wait makes its plane listen (one listening backend, counters readable) until it is
    admitted; once no waiter has been waiting for ``LINGER_S`` the listener runs ``UNLISTEN`` and reads nothing."""
    monkeypatch.setattr(ListeningDoorbell, "LINGER_S", 0.3)
    waiter = make_plane(policy=ONE_SEAT)
    holder = make_plane(policy=ONE_SEAT)
    held = lease_in_phase(holder, "active", "held", now=500)
    enqueue(waiter, "mine", agent_id="b", now=wall_clock_ms())
    doorbell = waiter._ctx.doorbell
    assert isinstance(doorbell, ListeningDoorbell)
    assert listening_backends(database_url) == 0
    result: list[Any] = []
    waited = threading.Event()

    def wait() -> None:
        result.append(waiter.wait_for_admission("mine", "me", timeout_ms=20_000, on_wait=lambda _now: waited.set()))

    thread = threading.Thread(target=wait)
    thread.start()
    assert waited.wait(10), "the waiter found the seat taken"
    deadline = time.monotonic() + 5
    while doorbell.read() is None:
        assert time.monotonic() < deadline, "the waiting plane never listened"
        time.sleep(0.005)
    assert listening_backends(database_url) == 1
    holder.complete_live_turn(held, wall_clock_ms(), LiveTurnCompletion("completed"))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert result[0] is not None
    deadline = time.monotonic() + 10
    while doorbell.read() is not None:
        assert time.monotonic() < deadline, "the listener kept listening after the linger"
        time.sleep(0.02)
    assert listening_backends(database_url) == 0
    assert doorbell._thread is not None
    assert doorbell._thread.is_alive(), "the thread stays, with its connection, for the next waiter"
