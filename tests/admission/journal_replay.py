"""Replay of the sanitized event journal: what each request went through, in commit order.

The journal carries no identifiers, only a keyed correlation HMAC per request, so the
replay tracks requests by that HMAC. SQLite serialises writers and ``event_seq`` is
assigned inside the writing transaction, so ``event_seq`` order is commit order and the
number of seat holders after each event is the number a reader could have observed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from admission_plane.states import ABSENT, SEAT_PHASES, EventKind, RequestState

#: Events that end a seat while the request's state (``recovery_required``) is still a seat phase.
_SEAT_FREEING_KINDS = frozenset({EventKind.REQUEST_RECOVERY_SEAT_RELEASED, EventKind.OPERATOR_SEAT_RELEASED})
#: Events that concern no request (a policy change, a recovery row the reaper could not trust).
_NOT_A_REQUEST = frozenset({EventKind.POLICY_DRAIN_COMPLETED, EventKind.RECOVERY_ROW_RETAINED})


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


def read_journal(plane: Any, page: int = 1000) -> Iterator[Any]:
    """Every event of ``plane``'s journal through ``read_sanitized_events`` (so every row is allowlist-checked)."""
    cursor = 0
    while True:
        events = plane.read_sanitized_events(after_event_seq=cursor, limit=page)
        if not events:
            return
        yield from events
        cursor = events[-1].event_seq


__all__ = ["JournalReplay", "read_journal", "replay"]
