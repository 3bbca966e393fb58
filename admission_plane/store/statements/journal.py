"""The identifier-free journal."""

from __future__ import annotations

from sqlalchemy import BigInteger, Text, cast, exists, insert, select

from ..model import Event, Lease
from ..rows import EventRow
from ..tx import Query, Statement
from ._build import P

#: ``inline``: no ``RETURNING`` of the new sequence number (nobody reads it; PostgreSQL would add one).
INSERT_EVENT = Statement(
    insert(Event)
    .inline()
    .values(
        kind=P("kind"),
        from_state=P("from_state"),
        to_state=P("to_state"),
        occurred_at=P("now"),
        correlation_hmac=P("correlation_hmac"),
    )
)

#: ``INSERT_EVENT`` only if the lease ``lease_id`` exists (the event of an admission tried in a unit that commits
#: either way, ``SENT_BLIND_TRY``).
INSERT_EVENT_IF_LEASE = Statement(
    insert(Event)
    .inline()
    .from_select(
        ["kind", "from_state", "to_state", "occurred_at", "correlation_hmac"],
        select(
            cast(P("kind"), Text),
            cast(P("from_state"), Text),
            cast(P("to_state"), Text),
            cast(P("now"), BigInteger),
            cast(P("correlation_hmac"), Text),
        ).where(exists().where(Lease.lease_id == P("lease_id"))),
    )
)


SELECT_EVENTS = Query(
    select(Event.event_seq, Event.kind, Event.from_state, Event.to_state, Event.occurred_at, Event.correlation_hmac)
    .where(Event.event_seq > P("after"))
    .order_by(Event.event_seq)
    .limit(P("limit")),
    EventRow,
)
