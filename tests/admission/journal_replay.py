"""Replay of the sanitized event journal: what each request went through, in commit order.

The journal carries no identifiers, only a keyed correlation HMAC per request, so the
replay tracks requests by that HMAC. The replay runs in ``event_seq`` order, and that order
is right for what it checks on both dialects:

* SQLite serialises writers and ``event_seq`` is assigned inside the writing transaction,
  so ``event_seq`` order is commit order.
* PostgreSQL: lease units (``Gate.LEASE`` in ``admission_plane.store.unit_of_work``) commit
  side by side, and beside admissions, so two of them may commit in the other order than
  their sequence numbers. But (1) every event that takes a seat (``request_admitted``) is
  written by an admission unit, and every unit whose events change a count replayed here
  takes their sequence numbers at its commit under the admission gate, which an admission
  holds exclusively from before its first read to its commit: every such event the
  admission saw committed has a lower number, and every one it did not see a higher one
  (the units that skip the gate, a start with no interval and a dispatch intent, keep every
  count as it was, so where their events fall changes no count); (2) the events of one request are in commit
  order, since a lease unit locks the lease row before it writes, and units of one lease
  follow each other; (3) every other event only keeps or lowers the number of seat holders
  and of leases in the start window. So between two admissions the true counts only fall,
  in whatever order the lease units committed, and the counts replayed right after each
  admission are exactly those the admission saw plus itself: the replayed maximum is the
  true maximum, and the per-request checks see each request's true history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import attrs

from admission_plane.states import ABSENT, SEAT_PHASES, START_WINDOW_PHASES, EventKind, RequestState

#: Events that end a seat while the request's state (``recovery_required``) is still a seat phase.
_SEAT_FREEING_KINDS = frozenset({EventKind.REQUEST_RECOVERY_SEAT_RELEASED, EventKind.OPERATOR_SEAT_RELEASED})
#: Events that concern no request (a policy change, a recovery row the reaper could not trust, a pause or resume).
_NOT_A_REQUEST = frozenset(
    {
        EventKind.POLICY_DRAIN_COMPLETED,
        EventKind.RECOVERY_ROW_RETAINED,
        EventKind.POLICY_REVISED,
        EventKind.ADMISSION_PAUSED,
        EventKind.ADMISSION_RESUMED,
        # Budget events follow a request's lifecycle beside it but change no request state.
        EventKind.BUDGET_RESERVED,
        EventKind.BUDGET_SETTLED,
        EventKind.BUDGET_USAGE_RECORDED,
        EventKind.BUDGET_CORRECTED,
    }
)


@attrs.frozen
class JournalReplay:
    """What the replay found; the ``*_violations`` tuples are empty for a sound journal."""

    event_count: int
    final_states: dict[str, str]
    admissions: Counter[str]
    max_seat_holders: int
    admitted_twice: tuple[str, ...]
    requeued: tuple[str, ...]
    discontinuities: tuple[tuple[int, str, str, str], ...]

    @property
    def requests(self) -> int:
        return len(self.final_states)


def replay(events: Iterable[Any]) -> JournalReplay:
    """Replay events (anything with ``event_seq, kind, from_state, to_state, correlation_hmac``).

    Tracks each correlation's state, counts the requests holding a seat after every event
    (state in :data:`SEAT_PHASES`, except after a seat release), and records requests
    admitted more than once, any return to ``queued`` after leaving it, and events whose
    ``from_state`` is not the request's tracked state.
    """
    states: dict[str, str] = {}
    holding: set[str] = set()
    admissions: Counter[str] = Counter()
    left_queue: set[str] = set()
    requeued: list[str] = []
    discontinuities: list[tuple[int, str, str, str]] = []
    max_holders = 0
    count = 0
    for event in sorted(events, key=lambda e: e.event_seq):
        count += 1
        correlation, kind, from_state, to_state = event.correlation_hmac, event.kind, event.from_state, event.to_state
        if kind in _NOT_A_REQUEST:
            continue
        if states.get(correlation, ABSENT) != from_state:
            discontinuities.append((event.event_seq, kind, states.get(correlation, ABSENT), from_state))
        if kind == EventKind.REQUEST_ADMITTED:
            admissions[correlation] += 1
        if to_state == RequestState.QUEUED and correlation in left_queue:
            requeued.append(correlation)
        if from_state == RequestState.QUEUED and to_state != RequestState.QUEUED:
            left_queue.add(correlation)
        states[correlation] = to_state
        if to_state in SEAT_PHASES and kind not in _SEAT_FREEING_KINDS:
            holding.add(correlation)
        else:
            holding.discard(correlation)
        max_holders = max(max_holders, len(holding))
    return JournalReplay(
        event_count=count,
        final_states=states,
        admissions=admissions,
        max_seat_holders=max_holders,
        admitted_twice=tuple(sorted(c for c, n in admissions.items() if n > 1)),
        requeued=tuple(requeued),
        discontinuities=tuple(discontinuities),
    )


@attrs.frozen
class Moment:
    """The journal just after one event: who holds a seat and who is in the start window, by correlation."""

    event: Any
    holding: frozenset[str]
    starting: frozenset[str]


def timeline(events: Iterable[Any]) -> Iterator[Moment]:
    """Every event in ``event_seq`` order with the seat holders and start-window leases just after it (policy,
    pause and recovery-row events included, with the holders unchanged)."""
    holding: set[str] = set()
    starting: set[str] = set()
    for event in sorted(events, key=lambda e: e.event_seq):
        if event.kind not in _NOT_A_REQUEST:
            correlation, kind, to_state = event.correlation_hmac, event.kind, event.to_state
            if to_state in SEAT_PHASES and kind not in _SEAT_FREEING_KINDS:
                holding.add(correlation)
            else:
                holding.discard(correlation)
            if to_state in START_WINDOW_PHASES:
                starting.add(correlation)
            else:
                starting.discard(correlation)
        yield Moment(event, frozenset(holding), frozenset(starting))


def most_at_once(
    moments: Iterable[Moment], group_of: Callable[[str], Hashable | None], *, starts: bool = False
) -> Counter[Any]:
    """The most seat holders (``starts``: start-window leases) each group had at any one moment; ``group_of`` maps a
    correlation to its group (``None``: counted in no group)."""
    most: Counter[Any] = Counter()
    for moment in moments:
        now: Counter[Any] = Counter(
            group for group in map(group_of, moment.starting if starts else moment.holding) if group is not None
        )
        for group, held in now.items():
            most[group] = max(most[group], held)
    return most


def read_journal(plane: Any, page: int = 1000) -> Iterator[Any]:
    """Every event of ``plane``'s journal through ``read_sanitized_events`` (so every row is allowlist-checked)."""
    cursor = 0
    while True:
        events = plane.read_sanitized_events(after_event_seq=cursor, limit=page)
        if not events:
            return
        yield from events
        cursor = events[-1].event_seq


__all__ = ["JournalReplay", "Moment", "most_at_once", "read_journal", "replay", "timeline"]
