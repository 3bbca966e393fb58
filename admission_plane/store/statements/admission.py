"""Admission: queue time-outs, capacity counts, the chosen request, and a queued request's place.

The admission rule itself walks the admission index (:mod:`.queue`,
:mod:`admission_plane.service._selection`).
"""

from __future__ import annotations

from sqlalchemy import and_, exists, func, select, tuple_

from ...states import SEAT_PHASES, RequestState
from ..model import Cooldown, Lease, StartHistory, TurnPayload, TurnRequest
from ..rows import Candidate, QueuedEntry
from ..tx import Query, Scalar
from ._build import P, lit, one, one_of

R, L, C, PL, SH = TurnRequest, Lease, Cooldown, TurnPayload, StartHistory
QUEUED = RequestState.QUEUED

SELECT_EXPIRED: Scalar[str] = Scalar(
    select(R.request_id).where(R.state == lit(QUEUED), R.deadline_at <= P("now")).order_by(R.request_id)
)
ANY_EXPIRED: Scalar[int] = Scalar(select(one()).where(R.state == lit(QUEUED), R.deadline_at <= P("now")).limit(1))

COUNT_SEAT_LEASES: Scalar[int] = Scalar(select(func.count()).select_from(L).where(one_of(L.phase, SEAT_PHASES)))
RECENT_START: Scalar[int] = Scalar(select(one()).where(SH.started_at > P("cutoff")).limit(1))

#: The request the rule chose, still queued, and its last lease generation.
SELECT_CANDIDATE = Query(
    select(R.request_id, R.lease_generation).where(R.request_id == P("request_id"), R.state == lit(QUEUED)),
    Candidate,
)

# --- a queued request's place (``get_queue_snapshot``: positions in enqueue order) ---------------

_queued_with_payload = and_(
    R.state == lit(QUEUED),
    exists().where(PL.request_id == R.request_id, PL.content_fingerprint.is_not(None)),
)
_not_cooling = ~exists().where(C.provider == R.provider, C.model == R.model, C.not_before > P("now"))
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
