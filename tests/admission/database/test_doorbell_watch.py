"""SQLite waiters sleep on an inotify watch of the doorbell's file (``FileWatch``) instead of reading it every
few milliseconds: a ring wakes them at once, from any process, and nothing else does.

Real gate files, a real second process for the cross-process ring, real inotify instances. Where the watch
is unavailable (not Linux, inotify instances used up) the waiter polls as before: that case is made by
replacing the module's C-library handle, since using up the user's real inotify instances would disturb every
other program of the user.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from planes import ONE_SEAT, enqueue, lease_in_phase

from admission_plane import AdmissionPlane, LiveTurnCompletion
from admission_plane.service import _waiting, wall_clock_ms
from admission_plane.service._wake import Wake
from admission_plane.store import doorbell as doorbell_module
from admission_plane.store.doorbell import Bell, Chimes, Doorbell, FileWatch, open_gate_file, ring

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
#: A bound on a wait that a ring ends, never reached unless the ring is lost (not a timing assertion).
RING_BOUND_S = 30.0

pytestmark = LINUX_ONLY


def _open(path: Path) -> Doorbell:
    bell = Doorbell.open(str(path))
    assert bell is not None
    return bell


def _watch(bell: Doorbell) -> FileWatch:
    watch = bell.watch()
    assert watch is not None, "Linux with inotify: the doorbell can be watched"
    return watch


def _ring_from_another_process(path: Path) -> None:
    code = (
        "import sys; from admission_plane.store.doorbell import Bell, Chimes, open_gate_file, ring; "
        "fd = open_gate_file(sys.argv[1]); ring(fd, Chimes.of(Bell.SEATS))"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)


def test_a_ring_from_another_process_wakes_the_watch(tmp_path: Path) -> None:
    """Nothing written: the wait times out (``False``). Another process rings: the wait returns ``True``, and
    the events are consumed, so the next wait sleeps again."""
    bell = _open(tmp_path / "gate")
    with closing(_watch(bell)) as watch:
        assert watch.wait(0) is False
        _ring_from_another_process(tmp_path / "gate")
        assert watch.wait(RING_BOUND_S) is True
        assert bell.read() == Chimes(0, 1, 0)
        assert watch.wait(0) is False, "the ring was consumed"
    bell.close()


def test_a_ring_between_the_read_and_the_wait_is_not_lost(tmp_path: Path) -> None:
    """The waiter reads the counters after its watch is in place; a ring that lands before it waits is pending
    on the watch, so the wait returns at once instead of sleeping through it."""
    bell = _open(tmp_path / "gate")
    writer = open_gate_file(str(tmp_path / "gate"))
    assert writer is not None
    try:
        with closing(_watch(bell)) as watch:
            assert bell.read() == Chimes()
            ring(writer, Chimes.of(Bell.QUEUE))
            assert watch.wait(0) is True
    finally:
        os.close(writer)
        bell.close()


def test_an_empty_ring_writes_nothing_and_wakes_nobody(tmp_path: Path) -> None:
    """A commit that changed nothing a waiter cares about rings an empty delta: no write, so no wake."""
    bell = _open(tmp_path / "gate")
    writer = open_gate_file(str(tmp_path / "gate"))
    assert writer is not None
    try:
        with closing(_watch(bell)) as watch:
            ring(writer, Chimes.of(0))
            assert watch.wait(0) is False
    finally:
        os.close(writer)
        bell.close()


def test_the_watch_is_on_the_open_file_not_on_whatever_the_path_leads_to_now(tmp_path: Path) -> None:
    """The path is replaced by another file after the doorbell opened (a hostile or careless rename): the
    watch follows the file the doorbell reads, so writes to the new file at the path do not wake it and
    rings on the doorbell's own file do."""
    path = tmp_path / "gate"
    bell = _open(path)
    original = os.open(path, os.O_RDWR)
    impostor = tmp_path / "impostor"
    impostor.write_bytes(b"\0" * 24)
    os.replace(impostor, path)
    try:
        with closing(_watch(bell)) as watch:
            path.write_bytes(b"\1" * 24)
            assert watch.wait(0) is False, "the new file at the path is not the doorbell's"
            ring(original, Chimes.of(Bell.STARTS))
            assert watch.wait(RING_BOUND_S) is True
            assert bell.read() == Chimes(0, 0, 1)
    finally:
        os.close(original)
        bell.close()


class _Libc:
    """Stands in for the C library's inotify functions (see the module docstring)."""

    def __init__(self, init_fd: int, watch_descriptor: int) -> None:
        self.init_fd, self.watch_descriptor = init_fd, watch_descriptor

    def inotify_init1(self, _flags: int) -> int:
        return self.init_fd

    def inotify_add_watch(self, _fd: int, _path: bytes, _mask: int) -> int:
        return self.watch_descriptor


def test_no_watch_without_inotify_and_nothing_left_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No C library handle (not Linux), ``inotify_init1`` refused (the user's instances used up: ``EMFILE``),
    ``inotify_add_watch`` refused (its descriptor is closed again), a closed doorbell: ``watch`` is ``None``."""
    bell = _open(tmp_path / "gate")
    monkeypatch.setattr(doorbell_module, "_LIBC", None)
    assert bell.watch() is None
    monkeypatch.setattr(doorbell_module, "_LIBC", _Libc(-1, 1))
    assert bell.watch() is None
    refused = os.open(os.devnull, os.O_RDONLY)
    monkeypatch.setattr(doorbell_module, "_LIBC", _Libc(refused, -1))
    assert bell.watch() is None
    with pytest.raises(OSError):
        os.fstat(refused)  # closed by ``watch``
    monkeypatch.undo()
    bell.close()
    assert bell.watch() is None


def test_a_watch_closes_once(tmp_path: Path) -> None:
    """``close`` is idempotent."""
    bell = _open(tmp_path / "gate")
    watch = _watch(bell)
    with closing(watch):
        pass
    watch.close()
    bell.close()


# --- one watch per doorbell, shared by its waiting threads ------------------------------------------------


class _CountingLibc:
    """The real C library, counting the inotify instances made through it."""

    def __init__(self, libc: Any) -> None:
        self.libc, self.instances = libc, 0

    def inotify_init1(self, flags: int) -> int:
        self.instances += 1
        return int(self.libc.inotify_init1(flags))

    def inotify_add_watch(self, fd: int, path: bytes, mask: int) -> int:
        return int(self.libc.inotify_add_watch(fd, path, mask))


def _await_in_threads(bell: Doorbell, timeouts: list[float]) -> tuple[int, list[threading.Thread], list[int]]:
    heard = bell.rings_heard()
    assert heard is not None
    woke: list[int] = []
    threads = [threading.Thread(target=lambda t=t: woke.append(bell.await_ring(heard, t))) for t in timeouts]
    for thread in threads:
        thread.start()
    return heard, threads, woke


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + RING_BOUND_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_the_threads_of_a_doorbell_share_one_watch_and_all_wake_at_a_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads wait on one doorbell: one inotify instance between them, one thread polling it, and a
    ring from another process wakes all four."""
    libc = _CountingLibc(doorbell_module._LIBC)
    monkeypatch.setattr(doorbell_module, "_LIBC", libc)
    bell = _open(tmp_path / "gate")
    heard, threads, woke = _await_in_threads(bell, [RING_BOUND_S] * 4)
    _until(lambda: bell._leading)
    assert bell._leading, "one thread polls the shared watch"
    _ring_from_another_process(tmp_path / "gate")
    for thread in threads:
        thread.join(RING_BOUND_S)
    assert woke == [heard + 1] * 4
    assert libc.instances == 1
    assert bell.rings_heard() == heard + 1
    assert libc.instances == 1, "kept for the next wait"
    bell.close()


def test_a_waiter_takes_over_the_watch_when_the_one_polling_it_gives_up(tmp_path: Path) -> None:
    """The thread polling the shared watch has the shorter timeout: when it returns (nothing rang), the other
    waiter polls in its place and still wakes at the ring."""
    bell = _open(tmp_path / "gate")
    heard, threads, woke = _await_in_threads(bell, [0.05])
    threads[0].join(RING_BOUND_S)
    assert woke == [heard], "timed out: nothing rang"
    heard, threads, woke = _await_in_threads(bell, [0.05, RING_BOUND_S])
    _until(lambda: len(woke) == 1)
    assert woke == [heard]
    _ring_from_another_process(tmp_path / "gate")
    threads[1].join(RING_BOUND_S)
    assert woke == [heard, heard + 1]
    bell.close()


def test_a_closed_doorbell_has_no_watch_and_its_waiters_return(tmp_path: Path) -> None:
    """Closed while a thread polls the shared watch: that thread returns at its timeout (the watch is closed
    then), later waits return at once, and ``rings_heard`` is ``None``."""
    bell = _open(tmp_path / "gate")
    heard, threads, woke = _await_in_threads(bell, [0.2])
    _until(lambda: bell._leading)
    bell.close()
    threads[0].join(RING_BOUND_S)
    assert woke == [heard]
    assert bell.rings_heard() is None
    assert bell.await_ring(heard, RING_BOUND_S) == heard


def test_no_shared_watch_without_inotify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a watch to be had, ``rings_heard`` is ``None`` (the waiter polls) and is tried again later."""
    bell = _open(tmp_path / "gate")
    monkeypatch.setattr(doorbell_module, "_LIBC", None)
    assert bell.rings_heard() is None
    monkeypatch.undo()
    assert bell.rings_heard() == 0
    bell.close()


# --- waiting for admission ------------------------------------------------------------------------


def _mine_behind_a_held_seat(make_plane: Callable[..., AdmissionPlane]) -> tuple[AdmissionPlane, AdmissionPlane, Any]:
    """A one-seat plane on the wall clock whose seat ``holder`` holds (lease ``held``, active), and ``mine``
    queued behind it for another agent: ``(plane, holder, held)``."""
    plane = make_plane(policy=ONE_SEAT)
    holder = make_plane(policy=ONE_SEAT)
    held = lease_in_phase(holder, "active", "held", now=wall_clock_ms())
    enqueue(plane, "mine", agent_id="b", now=wall_clock_ms())
    return plane, holder, held


def _admitted(outcome: list[Any]) -> Any:
    """The lease a waiting thread returned (it raised nothing and was admitted)."""
    (lease,) = outcome
    assert lease is not None
    assert not isinstance(lease, BaseException), lease
    return lease


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[bool]]:
    """Every doorbell read (of any plane of this process) and every watch wait's answer."""
    reads: list[int] = []
    waits: list[bool] = []
    read, wait = Doorbell.read, FileWatch.wait

    def counted_read(self: Doorbell) -> Chimes | None:
        reads.append(1)
        return read(self)

    def counted_wait(self: FileWatch, timeout_s: float) -> bool:
        woken = wait(self, timeout_s)
        waits.append(woken)
        return woken

    monkeypatch.setattr(Doorbell, "read", counted_read)
    monkeypatch.setattr(FileWatch, "wait", counted_wait)
    return reads, waits


def _wait_in_thread(plane: AdmissionPlane, request_id: str, **options: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(plane.wait_for_admission(request_id, "me", **options))
        except BaseException as error:  # reported by the test
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@SQLITE_ONLY
def test_a_waiter_sleeps_until_the_freed_seat_rings(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the wall clock, with the real ``time.sleep``, the waiter blocks on its watch: while the seat stays
    taken it reads the doorbell only at the clock checks (polling every ``initial_delay_ms`` of 1 ms would
    read it hundreds of times), and the ring of the freed seat wakes it and it is admitted."""
    reads, waits = _counting(monkeypatch)
    plane, holder, held = _mine_behind_a_held_seat(make_plane)
    thread, outcome = _wait_in_thread(plane, "mine", initial_delay_ms=1.0, fallback_ms=60_000)
    # Four waits that timed out: the waiter is asleep on its watch (each wait lasts a clock check, 50 ms).
    _until(lambda: waits.count(False) >= 4 or not thread.is_alive())
    assert not outcome, f"nothing freed the seat yet: {outcome}"
    assert waits.count(False) >= 4, "the waiter sleeps on a watch"
    reads_asleep = len(reads)
    holder.complete_live_turn(held, wall_clock_ms(), LiveTurnCompletion("completed"))
    thread.join(RING_BOUND_S)
    assert not thread.is_alive()
    assert _admitted(outcome).request_id == "mine"
    assert True in waits, "woken by the ring, not by a clock check"
    assert reads_asleep <= waits.count(False) + 2, "one read per wake, not one per millisecond"


@SQLITE_ONLY
def test_a_watched_wait_still_ends_at_its_timeout(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing rings: the watch's clock checks end the wait at ``timeout_ms`` (``None``: not admitted)."""
    _reads, waits = _counting(monkeypatch)
    plane, _holder, _held = _mine_behind_a_held_seat(make_plane)
    assert plane.wait_for_admission("mine", "me", timeout_ms=120) is None
    assert waits, "a watched wait"
    assert not any(waits), "only clock checks: nothing rang"


@SQLITE_ONLY
def test_without_a_watch_the_waiter_polls_and_is_admitted(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No inotify: the waiter reads the doorbell every step instead, and a freed seat is still taken."""
    monkeypatch.setattr(doorbell_module, "_LIBC", None)
    reads, waits = _counting(monkeypatch)
    plane, holder, held = _mine_behind_a_held_seat(make_plane)
    thread, outcome = _wait_in_thread(plane, "mine", initial_delay_ms=1.0, fallback_ms=60_000)
    _until(lambda: len(reads) >= 20 or not thread.is_alive())
    holder.complete_live_turn(held, wall_clock_ms(), LiveTurnCompletion("completed"))
    thread.join(RING_BOUND_S)
    assert _admitted(outcome).request_id == "mine"
    assert not waits, "no watch"


# --- the asyncio API --------------------------------------------------------------------------------------


def _async_wait(
    plane: AdmissionPlane, holder: AdmissionPlane | None, held: Any, free_after_s: float
) -> tuple[Any, int]:
    """Wait in an event loop for ``mine`` (timeout 1 s); ``holder`` completes ``held`` after ``free_after_s``
    (in the executor, as another connector would), unless ``holder`` is ``None``. The lease and the counter reads."""
    import asyncio

    from admission_plane.aio import AsyncAdmissionPlane

    async def main() -> tuple[Any, int]:
        async with AsyncAdmissionPlane(plane) as aplane:
            loop = asyncio.get_running_loop()

            async def free() -> None:
                await asyncio.sleep(free_after_s)
                assert holder is not None
                await loop.run_in_executor(
                    None, holder.complete_live_turn, held, wall_clock_ms(), LiveTurnCompletion("completed")
                )

            freeing = None if holder is None else asyncio.ensure_future(free())
            lease = await aplane.wait_for_admission("mine", "me", timeout_ms=1_000)
            if freeing is not None:
                await freeing
            return lease, aplane.bell.reads

    return asyncio.run(main())


@SQLITE_ONLY
def test_an_async_waiter_reads_the_counters_only_when_they_ring(make_plane: Callable[..., AdmissionPlane]) -> None:
    """The asyncio API on SQLite: the loop watches the doorbell's file, so a seat that stays held for the
    whole 1 s wait costs one read each time a watch begins (after each look: the fallback looks every 250 ms)
    and none between (the reader task read the counters every 5 ms, about 200 times)."""
    plane, _holder, _held = _mine_behind_a_held_seat(make_plane)
    lease, reads = _async_wait(plane, None, None, 0)
    assert lease is None  # the seat stayed held
    assert reads <= 6, f"{reads} counter reads in a 1 s wait with nothing ringing"


@SQLITE_ONLY
def test_an_async_waiter_is_admitted_at_the_ring_of_the_freed_seat(make_plane: Callable[..., AdmissionPlane]) -> None:
    """The seat is freed 0.2 s into the wait: the ring wakes the loop's watch and the waiter is admitted,
    with a handful of reads, not one per 5 ms."""
    plane, holder, held = _mine_behind_a_held_seat(make_plane)
    lease, reads = _async_wait(plane, holder, held, 0.2)
    assert lease is not None
    assert lease.request_id == "mine"
    assert reads <= 5, f"{reads} counter reads"


@SQLITE_ONLY
def test_an_async_waiter_without_a_watch_polls(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No inotify: the loop's reader task reads the counters every tick instead, and a freed seat is taken."""
    monkeypatch.setattr(doorbell_module, "_LIBC", None)
    plane, holder, held = _mine_behind_a_held_seat(make_plane)
    lease, reads = _async_wait(plane, holder, held, 0.2)
    assert lease is not None
    assert lease.request_id == "mine"
    assert reads >= 10, "polled every tick while the seat was held"


# --- far back in the queue: naps instead of a wake at every ring ------------------------------------------


@pytest.mark.parametrize(
    ("wake", "moved", "elapsed_s", "nap_s"),
    [
        (Wake(queue=1), 0, 0.0, 0.0),  # one departure away: watch for it
        (Wake(queue=5), 4, 0.02, 0.0),  # one left
        (Wake(queue=1, seats=True), 0, 0.0, 0.0),  # a freed seat: watch
        (Wake(queue=3, starts=True), 0, 0.0, 0.0),
        (Wake(queue=3, at=5_000), 0, 0.0, 0.0),  # a time it computed: watch, and wake for the clock
        (Wake(queue=5), 2, 0.01, 0.005),  # 3 to go at 5 ms each: half of the 2 before the last
        (Wake(queue=3), 0, 0.0, 0.001),  # none left yet, no time waited: the step (1 ms) per departure
        (Wake(queue=3), 0, 0.04, 0.04),  # none left in 40 ms: at least 40 ms per departure
    ],
)
def test_a_waiter_naps_through_half_the_departures_it_still_needs_but_one(
    wake: Wake, moved: int, elapsed_s: float, nap_s: float
) -> None:
    """``_nap``: only a waiter for departures alone, two or more away, naps; for half the time the departures
    it needs but one would take at the rate seen (or, none seen, at least the time waited so far)."""
    seen = Chimes(10, 20, 30)
    current = seen.plus(Chimes(moved, 7, 7))
    assert _waiting._nap(wake, seen, current, elapsed_s, 0.001) == pytest.approx(nap_s)


@SQLITE_ONLY
@pytest.mark.parametrize(("ahead", "watched"), [(3, False), (1, True)])
def test_only_a_waiter_near_its_turn_watches_for_rings(
    make_plane: Callable[..., AdmissionPlane], monkeypatch: pytest.MonkeyPatch, ahead: int, watched: bool
) -> None:
    """Behind ``ahead`` idle agents on a held seat, with nothing ringing for 0.3 s: three ahead, the waiter naps
    (no wait on the watch, so the rings of other waiters' turns would not wake it); one ahead, it watches."""
    _reads, waits = _counting(monkeypatch)
    plane, _holder, _held = _mine_behind_a_held_seat(make_plane)
    plane.cancel_queued("mine", wall_clock_ms())
    for index in range(ahead):
        enqueue(plane, f"ahead-{index}", agent_id=f"agent-{index}", now=wall_clock_ms())
    enqueue(plane, "late", agent_id="b", now=wall_clock_ms())
    assert plane.wait_for_admission("late", "me", timeout_ms=300) is None
    assert bool(waits) is watched
