"""The identifier-free journal."""

from __future__ import annotations

from sqlalchemy import insert, select

from ..model import Event
from ..rows import EventRow
from ..tx import Query, Statement
from ._build import P, quoted

INSERT_EVENT = Statement(
    insert(Event).values(
        kind=P("kind"),
        from_state=P("from_state"),
        to_state=P("to_state"),
        occurred_at=P("now"),
        correlation_hmac=P("correlation_hmac"),
    )
)


def event_literal(kind: str, from_state: str, to_state: str, now: int, correlation_hmac: str) -> str:
    """PostgreSQL: the insert of one event as constant SQL text, sent with the unit's ``COMMIT`` in the same
    round trip (:meth:`admission_plane.store.tx.Tx.defer`). The caller has checked every value: the three
    tokens are allowlisted constants, ``now`` an integer and the correlation a hex digest; quotes are
    doubled all the same."""
    tokens = ", ".join(quoted(str(value)) for value in (kind, from_state, to_state))
    return (
        "INSERT INTO events (kind, from_state, to_state, occurred_at, correlation_hmac) "
        f"VALUES ({tokens}, {int(now)}, {quoted(correlation_hmac)})"
    )


SELECT_EVENTS = Query(
    select(Event.event_seq, Event.kind, Event.from_state, Event.to_state, Event.occurred_at, Event.correlation_hmac)
    .where(Event.event_seq > P("after"))
    .order_by(Event.event_seq)
    .limit(P("limit")),
    EventRow,
)
