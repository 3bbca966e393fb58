"""Waiting for admission without a thread per waiter: one doorbell reader per plane and event loop.

Every waiting turn of an :class:`~admission_plane.aio.AsyncAdmissionPlane` registers a
future and a predicate ("has what I wait for moved since I looked?") with the plane's
:class:`AsyncBell`. On SQLite under Linux the loop watches the doorbell's file while anyone
waits (one inotify descriptor, :class:`~admission_plane.store.doorbell.FileWatch`, handed to
``add_reader``) and reads the counters (a ``pread`` of 24 bytes) at each ring; elsewhere one
reader task reads them every few milliseconds. On PostgreSQL there is no reader at all: the
listening thread hands each ring to the loop at once with ``call_soon_threadsafe``, and nothing
else moves the counters. Only when the counters moved are the futures whose predicate holds
resolved. A waiter's deadline is a ``call_later`` timer, not a task. So 200 waiting turns cost
one descriptor (a task where there is no watch, nothing on PostgreSQL), 200 futures and timers,
and one counter read per ring (per tick where polled).

The look itself (``admit_request``) is the sync path's, run in the plane's executor: the
doorbell only decides *when* to look, exactly as in :mod:`admission_plane.service._waiting`.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from .. import _validate as v
from ..service._admission import admit_request
from ..service._context import PlaneContext
from ..service._waiting import BEHIND_DELAY_S, LISTEN_READY_S
from ..service._wake import Wake
from ..store.doorbell import Chimes, Doorbell, FileWatch, ListeningDoorbell
from ..values import AdmittedLease
from ._support import maybe_await

T = TypeVar("T")


class Call(Protocol):
    """Runs a function in the plane's executor to its end and returns its result."""

    def __call__(self, function: Callable[[], T], /) -> Awaitable[T]: ...


class AsyncBell:
    """One event loop's view of a plane's doorbell, shared by every waiter of that plane."""

    def __init__(self, doorbell: Doorbell | ListeningDoorbell | None, interval_s: float) -> None:
        self._doorbell = doorbell
        self._interval_s = interval_s
        self._waiters: dict[asyncio.Future[None], Callable[[Chimes], bool]] = {}
        self._last: Chimes | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        #: SQLite on Linux, while anyone waits: the watch of the doorbell's file the loop reads.
        self._file_watch: FileWatch | None = None
        self.reads = 0  # counter reads by the reader task or at rings (the benchmark reports them)

    def read(self) -> Chimes | None:
        """The counters now, or ``None`` without a (listening) doorbell."""
        return None if self._doorbell is None else self._doorbell.read()

    async def listen(self, call: Call) -> Callable[[], None] | None:
        """PostgreSQL: take the doorbell's interest (it listens only while someone waits) and give its
        ``LISTEN`` a moment to be in place; the release function, or ``None`` where there is nothing to take."""
        doorbell = self._doorbell
        if not isinstance(doorbell, ListeningDoorbell):
            return None
        release = doorbell.interest()
        await call(functools.partial(doorbell.wait_ready, LISTEN_READY_S))
        return release

    async def wait(self, rung: Callable[[Chimes], bool], timeout_s: float) -> None:
        """Return once ``rung(counters)`` holds or after ``timeout_s`` seconds, whichever comes first."""
        current = self.read()
        if current is not None and rung(current):
            return  # it moved between the waiter's look and now
        loop = asyncio.get_running_loop()
        self._bind(loop)
        future: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(max(0.0, timeout_s), _resolve, future)
        self._waiters[future] = rung
        # PostgreSQL: the listening thread's rings call ``_check`` (``_bind``); reading between them finds nothing new.
        polled = self._task is not None and not self._task.done()
        if not isinstance(self._doorbell, ListeningDoorbell) and self._file_watch is None and not polled:
            self._last = current
            if not self._start_watch(loop):
                self._task = loop.create_task(self._poll(), name="admission-plane-aio-doorbell")
        try:
            await future
        finally:
            timer.cancel()
            self._waiters.pop(future, None)
            if not self._waiters:
                self._stop_watch()

    def close(self) -> None:
        """Stop the reader (task or watch) and the PostgreSQL subscription (idempotent; waiters then time out)."""
        self._stop_watch()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is loop:
            return
        self.close()
        self._loop = loop
        if isinstance(self._doorbell, ListeningDoorbell):
            # The listening thread must never touch the loop's objects: it only schedules a check.
            def ring() -> None:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._check)

            self._unsubscribe = self._doorbell.subscribe(ring)

    def _start_watch(self, loop: asyncio.AbstractEventLoop) -> bool:
        """SQLite: have the loop call :meth:`_rung` at every ring; ``False`` where it cannot (no watch to be had,
        a loop without ``add_reader``): the caller polls instead."""
        doorbell = self._doorbell
        watch = doorbell.watch() if isinstance(doorbell, Doorbell) else None
        if watch is None:
            return False
        try:
            loop.add_reader(watch.fileno(), self._rung)
        except NotImplementedError:  # a loop without readers (Windows' proactor): poll
            watch.close()
            return False
        self._file_watch = watch
        self._check()  # the watch is in place: a ring since the waiter's read is seen now, later ones at the ring
        return True

    def _stop_watch(self) -> None:
        watch, self._file_watch = self._file_watch, None
        if watch is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(watch.fileno())
        watch.close()

    def _rung(self) -> None:
        watch = self._file_watch
        if watch is not None:
            watch.drain()
            self._check()

    async def _poll(self) -> None:
        while self._waiters:
            self._check()
            await asyncio.sleep(self._interval_s)

    def _check(self) -> None:
        current = self.read()
        self.reads += 1
        if current is None or current == self._last:
            return
        self._last = current
        for future, rung in list(self._waiters.items()):
            if not future.done() and rung(current):
                future.set_result(None)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_for_admission(
    ctx: PlaneContext,
    bell: AsyncBell,
    call: Call,
    request_id: str,
    owner_instance_id: str,
    *,
    timeout_ms: int | None,
    initial_delay_ms: float,
    max_delay_ms: float,
    sleep: Callable[[float], Awaitable[object]],
    on_wait: Callable[[int], object] | None,
    fallback_ms: int,
    adopt: Callable[[AdmittedLease], object] | None = None,
    start: bool = False,
) -> AdmittedLease | None:
    """The async twin of :func:`admission_plane.service._waiting.wait_for_admission`.

    ``call`` runs a function in the plane's executor to its end (see :func:`settle`);
    ``adopt(lease)`` runs in the worker thread right after an admission committed, so a
    cancellation that arrives meanwhile cannot lose the lease.
    """
    v.identifier(request_id, "admission request ID")
    v.identifier(owner_instance_id, "admission owner instance ID")
    if timeout_ms is not None:
        v.timestamp(timeout_ms, "admission wait timeout")
    v.positive_integer(fallback_ms, "admission wait fallback")
    v.delay_ms(initial_delay_ms, "admission wait initial delay")
    v.delay_ms(max_delay_ms, "admission wait maximum delay")
    v.hook(sleep, "admission wait sleep")
    v.hook(on_wait, "admission wait on_wait", optional=True)
    v.flag(start, "admission wait start")
    deadline = None if timeout_ms is None else ctx.now() + timeout_ms
    delay = initial_delay_ms / 1000
    # PostgreSQL: the first attempt writes at once unless this plane's last wait had to wait, as in the sync
    # wait (see ``service._waiting``); later attempts look first.
    direct = ctx.engine.dialect.name == "postgresql" and not ctx.queue_busy
    first = True

    def look() -> tuple[Chimes | None, int, AdmittedLease | None, Wake | None]:
        seen = bell.read()  # before the look: a ring during the look still counts
        now = ctx.now()
        lease, wake = admit_request(ctx, request_id, now, owner_instance_id, direct=direct, parallel=True, start=start)
        if lease is not None and adopt is not None:
            adopt(lease)
        return seen, now, lease, wake

    release: Callable[[], None] | None = None
    try:
        while True:
            seen, now, lease, wake = await call(look)
            direct = False
            if lease is not None:
                ctx.queue_busy = not first
                return lease
            first = False
            if wake is None or (deadline is not None and now >= deadline):
                return None
            if on_wait is not None:
                await maybe_await(on_wait(now))
            if seen is None and release is None:
                release = await bell.listen(call)
                if release is not None and bell.read() is not None:
                    continue  # look again now that every ring is heard
            if seen is not None:
                limit = min(moment for moment in (now + fallback_ms, wake.at, deadline) if moment is not None)
                await bell.wait(functools.partial(wake.rung, seen), (limit - now) / 1000)
                continue
            if wake.queue and not (wake.seats or wake.starts or wake.at is not None):
                await sleep(BEHIND_DELAY_S * _jitter())  # behind another request: ours may be next
                continue
            await sleep(delay * _jitter())
            delay = min(delay * 2, max_delay_ms / 1000)
    finally:
        if release is not None:
            release()


def _jitter() -> float:
    return 0.5 + random.random()  # noqa: S311 - jitter, not cryptography
