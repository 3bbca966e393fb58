"""The identifier-free journal: every state change appends one event; reading validates every row."""

from __future__ import annotations

from .. import _validate as v
from ..errors import AdmissionStateError, InvalidInputError
from ..states import EVENT_STATES, RECOVERY_ROW_EVENT_ID, RETAINED, UNTRUSTED, EventKind, is_allowed_transition
from ..store.rows import EventRow
from ..store.statements.journal import INSERT_EVENT, INSERT_EVENT_IF_LEASE, SELECT_EVENTS
from ..store.tx import Tx
from ..store.unit_of_work import Gate
from ..values import SanitizedEvent
from ._context import PlaneContext

_EVENT_KINDS = frozenset(str(member) for member in EventKind)
MAX_PAGE = 1000
#: The most ``recovery_row_retained`` events one call journals (one transaction); the reaper calls again for more.
MAX_UNTRUSTED_ROWS = 1000


def record(
    ctx: PlaneContext,
    tx: Tx,
    kind: str,
    request_id: str,
    from_state: str,
    to_state: str,
    now: int,
    *,
    if_lease: str | None = None,
) -> None:
    """Append ``kind(from_state -> to_state)`` for ``request_id`` (stored as its correlation HMAC only); with
    ``if_lease``, only if that lease exists when the transaction commits (an admission the server may not make)."""
    v.identifier(request_id, "event correlation input")
    v.timestamp(now, "event timestamp")
    if not is_allowed_transition(kind, from_state, to_state):
        raise AdmissionStateError("admission event transition is not allowlisted")
    params = {"kind": str(kind), "from_state": str(from_state), "to_state": str(to_state), "now": now}
    # Nothing reads it back in the transaction: on PostgreSQL it travels with the commit (``Tx.defer``).
    params["correlation_hmac"] = ctx.keys.correlation(request_id)
    if if_lease is None:
        tx.defer(INSERT_EVENT, params)
    else:
        tx.defer(INSERT_EVENT_IF_LEASE, {**params, "lease_id": if_lease})


def record_untrusted_rows(ctx: PlaneContext, count: int, now: int) -> None:
    """Journal one ``recovery_row_retained`` event per recovery row the reaper could not trust.

    The events name no row: what identifies a row is exactly what could not be trusted, so
    they are correlated with a fixed input, as policy events are. The rows are not touched. At most
    :data:`MAX_UNTRUSTED_ROWS` per call, so that no count can hold one transaction open for ever.
    """
    if not v.is_safe_integer(count) or not 1 <= count <= MAX_UNTRUSTED_ROWS:
        raise InvalidInputError(f"untrusted recovery row count must be an integer from 1 to {MAX_UNTRUSTED_ROWS}")
    v.timestamp(now, "untrusted recovery row timestamp")

    def work(tx: Tx) -> None:
        for _ in range(count):
            record(ctx, tx, EventKind.RECOVERY_ROW_RETAINED, RECOVERY_ROW_EVENT_ID, UNTRUSTED, RETAINED, now)

    ctx.run(work)


def read_page(ctx: PlaneContext, after_event_seq: int, limit: int) -> tuple[SanitizedEvent, ...]:
    """A page of the journal, oldest first; a tampered row fails the whole read."""
    if not v.is_safe_integer(after_event_seq) or after_event_seq < 0:
        raise InvalidInputError("sanitized event cursor must be a non-negative safe integer")
    if not v.is_safe_integer(limit) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError("sanitized event page limit must be between 1 and 1000")
    params = {"after": after_event_seq, "limit": limit}
    # PostgreSQL: lease units commit side by side, so an event may commit after one with a
    # higher ``event_seq``, and a reader paging by sequence could step over it. Reading under
    # the gate taken exclusively waits until no writer is in flight: every sequence number
    # handed out so far then belongs to a committed event or to none (a rollback), so the page
    # is a gap-free prefix of what will ever be committed below its last number.
    rows = ctx.run(lambda tx: tx.all(SELECT_EVENTS, params), read_only=True, gate=Gate.EXCLUSIVE)
    return tuple(_sanitized(row) for row in rows)


def _sanitized(row: EventRow) -> SanitizedEvent:
    if not v.is_safe_integer(row.event_seq) or row.event_seq < 1:
        raise AdmissionStateError("sanitized event journal contains an invalid sequence")
    kind, from_state, to_state = row.kind, row.from_state, row.to_state
    if kind not in _EVENT_KINDS or from_state not in EVENT_STATES or to_state not in EVENT_STATES:
        raise AdmissionStateError("sanitized event journal contains a non-allowlisted transition")
    if not v.is_safe_integer(row.occurred_at) or row.occurred_at < 0:
        raise AdmissionStateError("sanitized event timestamp must be a non-negative safe integer")
    if not _is_hex_digest(row.correlation_hmac):
        raise AdmissionStateError("sanitized event journal contains an invalid correlation HMAC")
    if not is_allowed_transition(kind, from_state, to_state):
        raise AdmissionStateError("sanitized event journal contains a non-allowlisted transition")
    return SanitizedEvent(row.event_seq, kind, from_state, to_state, row.occurred_at, row.correlation_hmac)


def _is_hex_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(char in "0123456789abcdef" for char in value)
