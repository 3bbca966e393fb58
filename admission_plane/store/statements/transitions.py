"""The statements every state change is made of (applied by ``service._transitions.change``).

Each update is guarded by the state it leaves, so a row that moved meanwhile is not
touched (the caller sees a row count of 0); lease updates are also fenced by lease id,
owner instance and generation.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, update

from ..model import Lease, TurnPayload, TurnRequest
from ..tx import Statement
from ._build import P, fenced

R, L = TurnRequest, Lease

#: queued -> admitted, recording the new lease's generation.
RESERVE_REQUEST = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == P("source"))
    .values(state=P("target"), lease_generation=P("generation"))
)
INSERT_LEASE = Statement(
    insert(L).values(
        lease_id=P("lease_id"),
        request_id=P("request_id"),
        generation=P("generation"),
        owner_instance_id=P("owner_instance_id"),
        phase=P("target"),
        acquired_at=P("now"),
        heartbeat_at=P("now"),
    )
)
#: A queued request leaves the queue without a lease (cancelled, timed out, owner gone).
END_QUEUED_REQUEST = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == P("source"))
    .values(state=P("target"), terminal_at=P("now"))
)
SET_LEASE_PHASE = Statement(
    fenced(update(L)).where(L.phase == P("source")).values(phase=P("target"), heartbeat_at=P("now"))
)
DELETE_LEASE = Statement(fenced(delete(L)).where(L.phase == P("phase")))
_leased_request = (R.request_id == P("request_id"), R.state == P("source"), R.lease_generation == P("generation"))
SET_REQUEST_STATE = Statement(update(R).where(*_leased_request).values(state=P("target")))
END_LEASED_REQUEST = Statement(update(R).where(*_leased_request).values(state=P("target"), terminal_at=P("now")))
DELETE_PAYLOAD = Statement(delete(TurnPayload).where(TurnPayload.request_id == P("request_id")))
