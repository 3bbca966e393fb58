"""Read-only statements of the operator surface (``/metrics`` and the dashboard).

Every statement here only reads, and each is shaped to stay cheap at a deep queue: the
queue is read through the ``(state, enqueued_at)`` index, requests are counted only in the
states that are not history (so the cost never grows with the turns already finished),
and seat-holding leases are few by construction (bounded by the policy). The journal is
read forward from a sequence number (the primary key), never scanned from the start on a
scrape. None of them selects a request, session or agent id, or a payload; the lease id
is read only to be hashed by the caller into an opaque, per-server handle.
"""

from __future__ import annotations

from sqlalchemy import case, func, select

from ...states import SEAT_PHASES, START_WINDOW_PHASES, TERMINAL_STATES, RequestState
from ..model import Cooldown, Event, Lease, LeaseProcessIdentity, PolicyState, QueueEntry, TurnRequest
from ._build import P, lit, one_of

#: Request states that are not history: a scrape counts these (recovery_required too: it is debt).
LIVE_REQUEST_STATES = frozenset(
    str(state) for state in RequestState if state not in TERMINAL_STATES or state is RequestState.RECOVERY_REQUIRED
)

_QUEUED = TurnRequest.state == lit(str(RequestState.QUEUED))

#: Admissible queued requests (those holding their payload) by lane and provider/model key: how many, and
#: the oldest enqueue time. Read from the admission index, whose covering index is in group order, so no
#: request row is visited (a deep queue costs one index scan, not a table lookup per request).
QUEUE_BY_KEY = select(
    QueueEntry.lane,
    QueueEntry.provider,
    QueueEntry.model,
    func.count().label("depth"),
    func.min(QueueEntry.enqueued_at).label("oldest"),
).group_by(QueueEntry.lane, QueueEntry.provider, QueueEntry.model)

#: Every queued request (with or without its payload), counted on the ``(state, ...)`` index alone.
QUEUED_TOTAL = select(func.count().label("total"), func.min(TurnRequest.enqueued_at).label("oldest")).where(_QUEUED)

#: Requests that are not history, by state, but ``queued`` (see :data:`QUEUED_TOTAL`): few, bounded by the seats.
REQUESTS_BY_LIVE_STATE = (
    select(TurnRequest.state, func.count().label("total"))
    .where(one_of(TurnRequest.state, LIVE_REQUEST_STATES - {str(RequestState.QUEUED)}))
    .group_by(TurnRequest.state)
)

#: Leases by phase, with how many are suspect.
LEASES_BY_PHASE = select(
    Lease.phase,
    func.count().label("total"),
    func.sum(case((Lease.suspect_since.is_not(None), 1), else_=0)).label("suspects"),
).group_by(Lease.phase)

_SEAT = one_of(Lease.phase, (str(phase) for phase in SEAT_PHASES))
_IN_START_WINDOW = case((one_of(Lease.phase, (str(phase) for phase in START_WINDOW_PHASES)), 1), else_=0)

#: Seats in use and start slots taken, by lane and provider/model key.
SEATS_BY_KEY = (
    select(
        TurnRequest.lane,
        TurnRequest.provider,
        TurnRequest.model,
        func.count().label("seats"),
        func.sum(_IN_START_WINDOW).label("starts"),
    )
    .select_from(Lease)
    .join(TurnRequest, TurnRequest.request_id == Lease.request_id)
    .where(_SEAT)
    .group_by(TurnRequest.lane, TurnRequest.provider, TurnRequest.model)
)

#: Every seat-holding lease (bounded by the policy's seats), oldest first, with its host's evidence.
SEAT_LEASES = (
    select(
        Lease.lease_id,
        Lease.phase,
        Lease.acquired_at,
        Lease.heartbeat_at,
        Lease.suspect_since,
        Lease.suspect_reason,
        TurnRequest.lane,
        TurnRequest.provider,
        TurnRequest.model,
        LeaseProcessIdentity.host_id,
        LeaseProcessIdentity.lease_id.label("evidence"),
    )
    .select_from(Lease)
    .join(TurnRequest, TurnRequest.request_id == Lease.request_id)
    .outerjoin(LeaseProcessIdentity, LeaseProcessIdentity.lease_id == Lease.lease_id)
    .where(_SEAT)
    .order_by(Lease.acquired_at, Lease.lease_id)
    .limit(P("limit"))
)

#: Cooldowns still in force at ``now``.
ACTIVE_COOLDOWNS = (
    select(Cooldown.provider, Cooldown.model, Cooldown.not_before)
    .where(Cooldown.not_before > P("now"))
    .order_by(Cooldown.provider, Cooldown.model)
)

#: The journal after ``after`` (its primary key), in commit order, one page at a time.
EVENTS_AFTER = (
    select(Event.event_seq, Event.kind, Event.from_state, Event.to_state, Event.occurred_at, Event.correlation_hmac)
    .where(Event.event_seq > P("after"))
    .order_by(Event.event_seq)
    .limit(P("limit"))
)

#: Whether a durable policy was ever claimed (else every connector runs its own, and no limit is the plane's).
POLICY_CLAIMED = select(func.count()).select_from(PolicyState)

#: The newest event's sequence number (0 for an empty journal).
LAST_EVENT_SEQ = select(func.coalesce(func.max(Event.event_seq), 0))

__all__ = [
    "ACTIVE_COOLDOWNS",
    "EVENTS_AFTER",
    "LAST_EVENT_SEQ",
    "LEASES_BY_PHASE",
    "LIVE_REQUEST_STATES",
    "POLICY_CLAIMED",
    "QUEUED_TOTAL",
    "QUEUE_BY_KEY",
    "REQUESTS_BY_LIVE_STATE",
    "SEATS_BY_KEY",
    "SEAT_LEASES",
]
