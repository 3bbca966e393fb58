"""What the journal says, read forward from the last event this server has seen.

The journal is append-only and its sequence numbers follow commit order (SQLite's single
writer; PostgreSQL writers serialise on the plane's advisory lock), so reading it forward
from a cursor is exact: every process and host that writes to the plane is counted, and a
scrape reads only the events committed since the previous one. The first read takes the
whole journal once, in pages.

From it: events by kind, reaper outcomes, the admission wait (enqueue to admission of the
same correlation HMAC), and per-minute changes of the queue depth and the seats in use
(for the dashboard's charts, anchored at the values the tables hold now). Only kinds,
states, times and HMACs are read; the HMACs are kept only while a request waits.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import attrs
from sqlalchemy import Connection

from ..states import ABSENT, EventKind, LeaseEffect, RequestState, transition
from ..store.advisory import ADVISORY_LOCK_KEY, LEASE_LOCK_KEY
from ..store.statements.metrics import EVENTS_AFTER, LAST_EVENT_SEQ

#: Upper bounds (seconds) of the admission-wait histogram's buckets (+Inf is implied).
WAIT_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0)
#: Events that only the reaper writes, by the outcome they record.
REAPER_OUTCOMES = {
    str(EventKind.REQUEST_RECOVERY_SEAT_RELEASED): "seat_released",
    str(EventKind.LEASE_OWNER_DEAD): "owner_dead_released",
    str(EventKind.QUEUED_OWNER_DEAD): "queued_owner_settled",
    str(EventKind.RECOVERY_ROW_RETAINED): "untrusted_row_retained",
}
MINUTE_MS = 60_000
#: Minutes of history the charts show.
CHART_MINUTES = 30
TAIL_LENGTH = 25
_PAGE = 5_000
_QUEUED = str(RequestState.QUEUED)


@attrs.frozen
class JournalEvent:
    """One event as the dashboard shows it (no correlation HMAC: it stays on the server)."""

    seq: int
    occurred_at: int
    kind: str
    from_state: str
    to_state: str


@attrs.define
class _Minute:
    admissions: int = 0
    queue_delta: int = 0
    seat_delta: int = 0


@attrs.frozen
class WaitHistogram:
    """Cumulative bucket counts (one per bound, then +Inf), the sum in seconds, the count."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum_seconds: float
    count: int


@attrs.frozen
class JournalFigures:
    """What the journal says up to ``last_seq``."""

    last_seq: int
    events_by_kind: dict[str, int]
    reaper_outcomes: dict[str, int]
    admission_wait: WaitHistogram
    tail: tuple[JournalEvent, ...]
    #: Per minute (oldest first): the minute's start (ms), admissions, and the queue and seat changes.
    minutes: tuple[tuple[int, int, int, int], ...]


class JournalFollower:
    """Keeps the journal's figures current; :meth:`advance` reads what was committed since the last call.

    Thread-safe: concurrent scrapes and the dashboard's poller share one follower.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._cursor = 0
        self._by_kind: Counter[str] = Counter()
        self._buckets = [0] * (len(WAIT_BUCKETS_SECONDS) + 1)
        self._wait_sum_ms = 0
        self._waiting: dict[str, int] = {}
        self._tail: deque[JournalEvent] = deque(maxlen=TAIL_LENGTH)
        self._minutes: dict[int, _Minute] = {}

    def advance(self, connection: Connection, now: int) -> JournalFigures:
        """Read the events after the cursor (all of them the first time) and return the figures."""
        with self._lock:
            if connection.dialect.name == "postgresql":
                # Lease steps commit side by side, so a sequence number may commit after a higher
                # one; both gates taken exclusively (held to the end of this reading's transaction)
                # wait until no writer that holds a sequence number is in flight (each takes its
                # numbers under one of them), as read_page does, so none is skipped.
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LEASE_LOCK_KEY})")
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})")
            last = int(connection.execute(LAST_EVENT_SEQ).scalar_one())
            if last < self._cursor:  # the journal was recreated (a downgrade to base and back): start over
                self._reset()
            while self._cursor < last:
                rows = connection.execute(EVENTS_AFTER, {"after": self._cursor, "limit": _PAGE}).all()
                if not rows:
                    break
                for row in rows:
                    self._take(row)
                self._cursor = int(rows[-1].event_seq)
            self._prune(now)
            return self._figures()

    def _take(self, row: Any) -> None:
        kind, source, target = str(row.kind), str(row.from_state), str(row.to_state)
        at = int(row.occurred_at)
        self._by_kind[kind] += 1
        self._tail.append(JournalEvent(int(row.event_seq), at, kind, source, target))
        minute = self._minutes.setdefault(at - at % MINUTE_MS, _Minute())
        if target == _QUEUED and source == ABSENT:
            self._waiting[str(row.correlation_hmac)] = at
            minute.queue_delta += 1
        elif source == _QUEUED and target != _QUEUED:
            minute.queue_delta -= 1
            enqueued = self._waiting.pop(str(row.correlation_hmac), None)
            if kind == EventKind.REQUEST_ADMITTED:
                minute.admissions += 1
                if enqueued is not None:
                    self._observe_wait(max(0, at - enqueued))
        edge = transition(kind, source, target)
        if edge is not None and edge.lease is LeaseEffect.CREATE:
            minute.seat_delta += 1
        elif edge is not None and edge.lease is LeaseEffect.DELETE:
            minute.seat_delta -= 1

    def _observe_wait(self, wait_ms: int) -> None:
        self._wait_sum_ms += wait_ms
        seconds = wait_ms / 1000
        for index, bound in enumerate(WAIT_BUCKETS_SECONDS):
            if seconds <= bound:
                self._buckets[index] += 1
                return
        self._buckets[-1] += 1

    def _prune(self, now: int) -> None:
        oldest = now - now % MINUTE_MS - CHART_MINUTES * MINUTE_MS
        for start in [start for start in self._minutes if start < oldest]:
            del self._minutes[start]

    def _figures(self) -> JournalFigures:
        cumulative, total = [], 0
        for count in self._buckets:
            total += count
            cumulative.append(total)
        outcomes = {name: self._by_kind.get(kind, 0) for kind, name in REAPER_OUTCOMES.items()}
        return JournalFigures(
            last_seq=self._cursor,
            events_by_kind=dict(sorted(self._by_kind.items())),
            reaper_outcomes=outcomes,
            admission_wait=WaitHistogram(WAIT_BUCKETS_SECONDS, tuple(cumulative), self._wait_sum_ms / 1000, total),
            tail=tuple(reversed(self._tail)),
            minutes=tuple(
                (start, m.admissions, m.queue_delta, m.seat_delta) for start, m in sorted(self._minutes.items())
            ),
        )


def chart_series(
    minutes: tuple[tuple[int, int, int, int], ...], now: int, queue_now: int, seats_now: int
) -> dict[str, list[int]]:
    """Per minute over the last :data:`CHART_MINUTES` minutes (the current one last): the minute's start,
    admissions in it, and the queue depth and seats in use at its end, worked back from the values now."""
    by_start = {start: (admissions, queue, seats) for start, admissions, queue, seats in minutes}
    current = now - now % MINUTE_MS
    starts = [current - offset * MINUTE_MS for offset in range(CHART_MINUTES - 1, -1, -1)]
    queue_depth, seats_in_use, admissions = [0] * len(starts), [0] * len(starts), [0] * len(starts)
    queue, seats = queue_now, seats_now
    for index in range(len(starts) - 1, -1, -1):  # newest first: the value at a minute's end, then undo it
        minute_admissions, queue_delta, seat_delta = by_start.get(starts[index], (0, 0, 0))
        queue_depth[index], seats_in_use[index], admissions[index] = max(0, queue), max(0, seats), minute_admissions
        queue -= queue_delta
        seats -= seat_delta
    return {"minute": starts, "queue_depth": queue_depth, "seats_in_use": seats_in_use, "admissions": admissions}
