"""Admission: queue time-outs, capacity counts, the admission rule, and a waiter's place."""

from __future__ import annotations

from sqlalchemy import and_, exists, func, literal_column, select, tuple_

from ...states import SEAT_PHASES, START_WINDOW_PHASES, RequestState
from ..model import Cooldown, Lease, StartHistory, TurnPayload, TurnRequest
from ..rows import Candidate, QueuedEntry, WaiterEntry
from ..tx import Query, Scalar
from ._build import P, lit, one, one_of

R, L, C, PL, SH = TurnRequest, Lease, Cooldown, TurnPayload, StartHistory
QUEUED = RequestState.QUEUED

SELECT_EXPIRED: Scalar[str] = Scalar(
    select(R.request_id).where(R.state == lit(QUEUED), R.deadline_at <= P("now")).order_by(R.request_id)
)
ANY_EXPIRED: Scalar[int] = Scalar(select(one()).where(R.state == lit(QUEUED), R.deadline_at <= P("now")).limit(1))

COUNT_SEAT_LEASES: Scalar[int] = Scalar(select(func.count()).select_from(L).where(one_of(L.phase, SEAT_PHASES)))
COUNT_START_WINDOW_LEASES: Scalar[int] = Scalar(
    select(func.count()).select_from(L).where(one_of(L.phase, START_WINDOW_PHASES))
)
RECENT_START: Scalar[int] = Scalar(select(one()).where(SH.started_at > P("cutoff")).limit(1))
RECENT_RESERVATION: Scalar[int] = Scalar(
    select(one()).where(one_of(L.phase, START_WINDOW_PHASES), L.acquired_at > P("cutoff")).limit(1)
)
LATEST_RESERVATION: Scalar[int] = Scalar(select(func.max(L.acquired_at)).where(one_of(L.phase, START_WINDOW_PHASES)))

_queued_with_payload = and_(
    R.state == lit(QUEUED),
    exists().where(PL.request_id == R.request_id, PL.content_fingerprint.is_not(None)),
)
_not_cooling = ~exists().where(C.provider == R.provider, C.model == R.model, C.not_before > P("now"))
_busy_agent = (
    select(one())
    .select_from(L)
    .join(TurnRequest.__table__.alias("holder"), literal_column("holder.request_id") == L.request_id)
    .where(one_of(L.phase, SEAT_PHASES), literal_column("holder.agent_id") == R.agent_id)
    .exists()
)

# The admission rule: the oldest queued request that has a payload and whose
# provider/model is not cooling down, preferring agents with no seat-holding lease.
# Both statements walk turn_requests_queue (state, enqueued_at) in order and stop at the
# first match, so their cost does not grow with queue depth.
SELECT_CANDIDATE_IDLE_AGENT = Query(
    select(R.request_id, R.lease_generation)
    .where(_queued_with_payload, _not_cooling, ~_busy_agent)
    .order_by(R.enqueued_at, R.request_id)
    .limit(1),
    Candidate,
)
SELECT_CANDIDATE_ANY = Query(
    select(R.request_id, R.lease_generation)
    .where(_queued_with_payload, _not_cooling)
    .order_by(R.enqueued_at, R.request_id)
    .limit(1),
    Candidate,
)

SELECT_CANDIDATE = Query(
    select(R.request_id, R.lease_generation).where(R.request_id == P("request_id"), R.state == lit(QUEUED)),
    Candidate,
)

# --- a queued request's place ------------------------------------------------------------------

SELECT_QUEUED_ENTRY = Query(
    select(R.enqueued_at, R.provider, R.model).where(R.request_id == P("request_id"), _queued_with_payload),
    QueuedEntry,
)
_ahead = tuple_(R.enqueued_at, R.request_id) <= tuple_(P("enqueued_at"), P("request_id"))
COUNT_AHEAD: Scalar[int] = Scalar(select(func.count()).select_from(R).where(_queued_with_payload, _ahead))
COUNT_ELIGIBLE_AHEAD: Scalar[int] = Scalar(
    select(func.count()).select_from(R).where(_queued_with_payload, _not_cooling, _ahead)
)
COOLDOWN_UNTIL: Scalar[int] = Scalar(
    select(C.not_before).where(C.provider == P("provider"), C.model == P("model"), C.not_before > P("now"))
)
# A waiting connector's place, for deciding when to look again (see ``store.doorbell``).
WAITER_ENTRY = Query(
    select(R.enqueued_at, R.agent_id, R.provider, R.model).where(R.request_id == P("request_id"), _queued_with_payload),
    WaiterEntry,
)
AGENT_HOLDS_SEAT: Scalar[int] = Scalar(
    select(one())
    .select_from(L)
    .join(R, R.request_id == L.request_id)
    .where(one_of(L.phase, SEAT_PHASES), R.agent_id == P("agent_id"))
    .limit(1)
)
_strictly_ahead = tuple_(R.enqueued_at, R.request_id) < tuple_(P("enqueued_at"), P("request_id"))
#: How many requests ahead a waiter's rank looks at: the rank is then a lower bound (the
#: waiter may look again earlier than needed), and the look's cost does not grow with depth.
RANK_HORIZON = 64
_idle_ahead = (
    select(R.agent_id)
    .where(_queued_with_payload, _not_cooling, ~_busy_agent, _strictly_ahead)
    .order_by(R.enqueued_at, R.request_id)
    .limit(RANK_HORIZON)
    .subquery()
)
COUNT_IDLE_AGENTS_AHEAD: Scalar[int] = Scalar(select(func.count(_idle_ahead.c.agent_id.distinct())))
