"""Waiting for admission on the doorbell: look, wait for what the look said, look again."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from .. import _validate as v
from ..store.doorbell import Chimes, Doorbell, ListeningDoorbell
from ..values import AdmittedLease
from ._admission import admit_request
from ._context import PlaneContext
from ._wake import Wake

#: With a doorbell, a waiter looks again at least this often (ms) even if nothing rang:
#: writers that do not ring (another program on the same file) are noticed this late.
DOORBELL_FALLBACK_MS = 250
#: How long a PostgreSQL waiter gives the doorbell's ``LISTEN`` to be in place before it looks again (s).
LISTEN_READY_S = 1.0
#: Without a doorbell, a waiter behind another request looks again after about this long (s).
BEHIND_DELAY_S = 0.003
#: On a listening doorbell (PostgreSQL) a ring wakes the waiter at once, so between rings it wakes only for
#: the plane's clock: at ``limit`` (its fallback, a time it computed, its deadline) and at least this often
#: (s), for clocks that are not paced like the wall clock (a test's clock moved by hand).
LISTENING_CLOCK_CHECK_S = 0.05


def wait_for_admission(
    ctx: PlaneContext,
    request_id: str,
    owner_instance_id: str,
    *,
    timeout_ms: int | None,
    initial_delay_ms: float,
    max_delay_ms: float,
    sleep: Callable[[float], object],
    on_wait: Callable[[int], object] | None,
    fallback_ms: int,
    start: bool = False,
) -> AdmittedLease | None:
    """See :meth:`admission_plane.AdmissionPlane.wait_for_admission`."""
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
    doorbell = ctx.doorbell
    # PostgreSQL: the doorbell listens only while someone waits; this waiter takes that interest
    # after its first attempt did not admit it, and gives it up when it returns.
    listening = doorbell if isinstance(doorbell, ListeningDoorbell) else None
    release: Callable[[], None] | None = None
    delay = initial_delay_ms / 1000
    # PostgreSQL: the first attempt writes at once (see ``admit_request``), unless this plane's last wait had
    # to wait: the queue is then likely busy, and a first attempt that takes the admission gate only to find
    # nothing to admit holds back every other admission and lease commit for nothing (measured: 16 connectors
    # on 8 seats). Later attempts look first, except one woken by the ring it waited for when its look said it
    # was the rule's next choice held back by capacity alone (``Wake.first``): the seat or start slot it
    # waited for was just freed, so the server usually admits it, and the look's round trips are spared.
    # Only a hint: the writing attempt re-checks everything either way.
    postgresql = ctx.engine.dialect.name == "postgresql"
    direct = postgresql and not ctx.queue_busy
    first = True
    # SQLite: the enqueue that just refused this request's admission (``admit_as``) looked for us under the
    # writer gate and read the doorbell there (``WaitHint``): start by waiting for what it found.
    hint = ctx.take_wait_hint(request_id, owner_instance_id) if isinstance(doorbell, Doorbell) else None
    seen: Chimes | None
    wake: Wake | None
    try:
        while True:
            if hint is not None:
                seen, wake, hint = hint.seen, hint.wake, None
                now = ctx.now()
            else:
                seen = None if doorbell is None else doorbell.read()
                now = ctx.now()
                lease, wake = admit_request(
                    ctx, request_id, now, owner_instance_id, direct=direct, parallel=True, start=start
                )
                direct = False
                if lease is not None:
                    ctx.queue_busy = not first
                    return lease
            first = False
            if wake is None or (deadline is not None and now >= deadline):
                return None
            if on_wait is not None:
                on_wait(now)
            if seen is None and listening is not None and release is None:
                release = listening.interest()
                if sleep is time.sleep and listening.wait_ready(LISTEN_READY_S) is not None:
                    continue  # look again now that every ring is heard
            if seen is not None and doorbell is not None:
                limit = min(moment for moment in (now + fallback_ms, wake.at, deadline) if moment is not None)
                rung = _await_doorbell(ctx, doorbell, seen, wake, limit, initial_delay_ms, max_delay_ms, sleep)
                direct = postgresql and rung and wake.first
                continue
            if wake.queue and not (wake.seats or wake.starts or wake.at is not None):
                # Behind another request: ours may be next, so look again soon.
                sleep(BEHIND_DELAY_S * _jitter())
                continue
            sleep(delay * _jitter())
            delay = min(delay * 2, max_delay_ms / 1000)
    finally:
        if release is not None:
            release()


def _await_doorbell(
    ctx: PlaneContext,
    doorbell: Doorbell | ListeningDoorbell,
    seen: Chimes,
    wake: Wake,
    limit: int,
    initial_delay_ms: float,
    max_delay_ms: float,
    sleep: Callable[[float], object],
) -> bool:
    """Sleep until ``wake`` is rung past ``seen`` or the plane's clock reaches ``limit``; whether it was rung.

    On PostgreSQL, with the real ``time.sleep``, the wait blocks on the listening doorbell and
    wakes at a ring it waits for (the listening thread checks ``wake`` for it: ``wait_until``), and
    otherwise only at ``limit`` or after
    :data:`LISTENING_CLOCK_CHECK_S` (it used to wake every step, ``initial_delay_ms`` for a waiter
    first in line: a thousand wake-ups a second per waiting connector); otherwise it polls the
    counters every step, or (SQLite on Linux) sleeps on the plane's watch of the gate file until a ring, the
    plane's clock reaches ``limit``, or :data:`LISTENING_CLOCK_CHECK_S` has passed.
    """
    step = initial_delay_ms / 1000
    listening = doorbell if isinstance(doorbell, ListeningDoorbell) and sleep is time.sleep else None

    def rung(current: Chimes) -> bool:
        return wake.rung(seen, current)

    # SQLite on Linux: the plane's watch of the gate file (``Doorbell.rings_heard`` before the first read, so a
    # ring from then on is never slept through); the counters are read first, then the waiter sleeps to the ring.
    heard = doorbell.rings_heard() if isinstance(doorbell, Doorbell) and sleep is time.sleep else None
    started = time.monotonic()
    while True:
        if listening is not None:
            # Woken by the listening thread only for a ring this waiter waits for (``wait_until``).
            current = listening.wait_until(rung, min(LISTENING_CLOCK_CHECK_S, max(0.0, (limit - ctx.now()) / 1000)))
        else:
            if heard is None:
                sleep(step * _jitter())
            current = doorbell.read()
        if current is None:
            return False
        if rung(current):
            return True
        now = ctx.now()
        if now >= limit:
            return False
        if isinstance(doorbell, Doorbell) and heard is not None:
            nap = _nap(wake, seen, current, time.monotonic() - started, initial_delay_ms / 1000)
            if nap:
                # Far back in the queue: every ring would wake it for nothing (each ring wakes every watching
                # plane), so it sleeps through about half the departures it still needs, then reads again.
                time.sleep(min(nap, LISTENING_CLOCK_CHECK_S, (limit - now) / 1000))
                heard = doorbell.rings_heard() or 0
            else:
                heard = doorbell.await_ring(heard, min(LISTENING_CLOCK_CHECK_S, (limit - now) / 1000))
        elif not (wake.seats or wake.starts):  # not first in line: no hurry
            step = min(step * 2, max_delay_ms / 1000)


def _nap(wake: Wake, seen: Chimes, current: Chimes, elapsed_s: float, step_s: float) -> float:
    """How long a watching waiter sleeps before it reads the counters again instead of waking at the next ring
    (seconds; 0: wait for the ring). Only a waiter for departures alone that needs two or more still naps:
    half the time the departures it needs but one would take at the rate seen since it began to wait (before
    it saw any, at least the time waited so far, or ``step_s``), so it naps less as its turn nears and
    watches for the last."""
    if wake.seats or wake.starts or wake.at is not None:
        return 0.0
    moved = current.since(seen).queue
    remaining = wake.queue - moved
    if remaining < 2:
        return 0.0
    # None left yet: the time waited so far is a lower bound on the interval, so the naps grow while the queue stands.
    interval = elapsed_s / moved if moved else max(elapsed_s, step_s)
    return (remaining - 1) * interval / 2


def _jitter() -> float:
    return 0.5 + random.random()  # noqa: S311 - jitter, not cryptography
