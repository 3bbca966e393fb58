"""The identifier-free journal."""

from __future__ import annotations

from sqlalchemy import insert, select

from ..model import Event
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


SELECT_EVENTS = Query(
    select(Event.event_seq, Event.kind, Event.from_state, Event.to_state, Event.occurred_at, Event.correlation_hmac)
    .where(Event.event_seq > P("after"))
    .order_by(Event.event_seq)
    .limit(P("limit")),
    EventRow,
)
