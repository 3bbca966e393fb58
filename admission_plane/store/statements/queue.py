"""The admission index: queued requests with a payload, and the heads of the groups they form.

Groups nest: a lane's provider/model *key*, an *agent* within it, a *session* within that.
Every group keeps its head, the oldest ``(enqueued_at, request_id)`` below it, so
admission reads a group's best request with one index seek and skips a whole group
(a cooling key, a busy agent, a session at its limit) by reading one head row. Adding an
entry can only lower heads; removing the head of a group moves that group's head to its
next member, level by level, and stops at the first level whose head it was not.
"""

from __future__ import annotations

from sqlalchemy import delete, func, insert, select, true, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from ...states import SEAT_PHASES
from ..model import AdmissionPause, Cooldown, LaneCredit, Lease, QueueAgent, QueueEntry, QueueKey, QueueSession
from ..model import TurnRequest as R
from ..rows import CooldownRow, CreditRow, EntryRow, KeyHeadRow, MemberHeadRow, PauseRow, SeatRow
from ..tx import Query, Statement
from ._build import P, one_of

E, QS, QA, QK = QueueEntry, QueueSession, QueueAgent, QueueKey

INSERT_ENTRY = Statement(
    insert(E).values(
        request_id=P("request_id"),
        lane=P("lane"),
        provider=P("provider"),
        model=P("model"),
        agent_id=P("agent_id"),
        session_id=P("session_id"),
        enqueued_at=P("enqueued_at"),
    )
)
SELECT_ENTRY = Query(
    select(E.lane, E.provider, E.model, E.agent_id, E.session_id, E.enqueued_at).where(E.request_id == P("request_id")),
    EntryRow,
)
DELETE_ENTRY = Statement(delete(E).where(E.request_id == P("request_id")))


def _group(table: type[QueueSession] | type[QueueAgent] | type[QueueKey], *columns: str) -> list[ColumnElement[bool]]:
    return [getattr(table, column) == P(column) for column in columns]


_KEY = ("lane", "provider", "model")
_AGENT = (*_KEY, "agent_id")
_SESSION = (*_AGENT, "session_id")


def _lower_head(table: type[QueueSession] | type[QueueAgent] | type[QueueKey], columns: tuple[str, ...]) -> Statement:
    """Insert a group's head, or lower it to the new entry if the entry is older (row count 0: unchanged)."""
    values = {column: P(column) for column in columns}
    values.update(head_enqueued_at=P("enqueued_at"), head_request_id=P("request_id"))
    older = tuple_(P("enqueued_at"), P("request_id")) < tuple_(table.head_enqueued_at, table.head_request_id)
    head = {"head_enqueued_at": P("enqueued_at"), "head_request_id": P("request_id")}
    keys = [getattr(table, column) for column in columns]
    return Statement(
        sqlite.insert(table).values(values).on_conflict_do_update(index_elements=keys, set_=head, where=older),
        postgresql=postgresql.insert(table)
        .values(values)
        .on_conflict_do_update(index_elements=keys, set_=head, where=older),
    )


LOWER_SESSION_HEAD = _lower_head(QS, _SESSION)
LOWER_AGENT_HEAD = _lower_head(QA, _AGENT)
LOWER_KEY_HEAD = _lower_head(QK, _KEY)

# A group whose head left: dropped if nothing is left below it, else its head moved to the
# oldest member below it. Both are guarded by ``head_request_id = :departed``, so a request
# that was not the group's head changes nothing (row count 0), and neither does it above.
_SESSION_MEMBERS = (E, ("enqueued_at", "request_id"))
_AGENT_MEMBERS = (QS, ("head_enqueued_at", "head_request_id"))
_KEY_MEMBERS = (QA, ("head_enqueued_at", "head_request_id"))


def _level(
    table: type[QueueSession] | type[QueueAgent] | type[QueueKey],
    columns: tuple[str, ...],
    members: tuple[type[QueueEntry] | type[QueueSession] | type[QueueAgent], tuple[str, str]],
) -> tuple[Statement, Statement]:
    member, (at, request) = members
    in_group = [getattr(member, column) == getattr(table, column) for column in columns]
    order = (getattr(member, at), getattr(member, request))
    departed = (*_group(table, *columns), table.head_request_id == P("departed"))
    drop = Statement(delete(table).where(*departed, ~select(member).where(*in_group).exists()))
    oldest = select(*order).where(*in_group).order_by(*order).limit(1)
    move = Statement(
        update(table)
        .where(*departed)
        .values(
            head_enqueued_at=oldest.with_only_columns(order[0]).scalar_subquery(),
            head_request_id=oldest.with_only_columns(order[1]).scalar_subquery(),
        )
    )
    return drop, move


DROP_SESSION, MOVE_SESSION_HEAD = _level(QS, _SESSION, _SESSION_MEMBERS)
DROP_AGENT, MOVE_AGENT_HEAD = _level(QA, _AGENT, _AGENT_MEMBERS)
DROP_KEY, MOVE_KEY_HEAD = _level(QK, _KEY, _KEY_MEMBERS)

#: PostgreSQL, a connection holding the session functions (:mod:`admission_plane.store.session_functions`):
#: the whole chain of ``INSERT_ENTRY`` and the ``LOWER_*_HEAD`` statements, or of ``DELETE_ENTRY`` and the
#: ``DROP_*``/``MOVE_*`` statements, as one call.
#: The call of ``QUEUE_ADD`` (also made by ``transitions.SENT_BLIND_TRY`` for a request it does not admit).
QUEUE_ADD_CALL = func.pg_temp.admission_plane_queue_add(
    P("request_id"), P("lane"), P("provider"), P("model"), P("agent_id"), P("session_id"), P("enqueued_at")
)
QUEUE_ADD = Statement(select(QUEUE_ADD_CALL), only="postgresql")
QUEUE_REMOVE = Statement(select(func.pg_temp.admission_plane_queue_remove(P("request_id"))), only="postgresql")

# --- what admission reads -----------------------------------------------------------------------

#: Every (lane, key) group with its head, in head order within each lane.
SELECT_KEYS = Query(
    select(QK.lane, QK.provider, QK.model, QK.head_enqueued_at, QK.head_request_id).order_by(
        QK.lane, QK.head_enqueued_at, QK.head_request_id
    ),
    KeyHeadRow,
)
_after = tuple_(P("after_enqueued_at"), P("after_request_id"))


def _page(table: type[QueueSession] | type[QueueAgent], member: str, group: tuple[str, ...]) -> Query[MemberHeadRow]:
    """A page of a group's members (``member`` of ``table``) in head order, after a given head."""
    head = (table.head_enqueued_at, table.head_request_id)
    return Query(
        select(getattr(table, member).label("member"), *head)
        .where(*_group(table, *group), tuple_(*head) > _after)
        .order_by(*head)
        .limit(P("page")),
        MemberHeadRow,
    )


#: A page of a key's agents; a page of an agent's sessions (within one key).
AGENT_PAGE, SESSION_PAGE = _page(QA, "agent_id", _KEY), _page(QS, "session_id", _AGENT)
_seat_request = (
    select(R.provider, R.model, R.agent_id, R.session_id).where(R.request_id == Lease.request_id).limit(1).lateral("r")
)
#: PostgreSQL: ``SELECT_SEATS`` with each lease's request read by its key, one lease at a time (a ``LATERAL``
#: subquery with ``LIMIT 1`` stays a nested loop over the leases). As a plain join, the generic plan a connection
#: made while ``turn_requests`` was small (a new database, or one whose statistics predate its growth: the table
#: keeps every request ever queued) was a hash join that read the whole table for each admission and look: at
#: 2 000 requests, analysed, 279 µs a read (one round trip) where the nested loop takes 134 µs.
SEATS_LATERAL = (
    select(Lease.phase, Lease.acquired_at, *_seat_request.c)
    .select_from(Lease)
    .join(_seat_request, true())
    .where(one_of(Lease.phase, SEAT_PHASES))
)
#: Every seat-holding lease with what it counts against (at most as many rows as seats held).
SELECT_SEATS = Query(
    select(Lease.phase, Lease.acquired_at, R.provider, R.model, R.agent_id, R.session_id)
    .join(R, R.request_id == Lease.request_id)
    .where(one_of(Lease.phase, SEAT_PHASES)),
    SeatRow,
    postgresql=SEATS_LATERAL,
)
SELECT_ACTIVE_COOLDOWNS = Query(
    select(Cooldown.provider, Cooldown.model, Cooldown.not_before).where(Cooldown.not_before > P("now")),
    CooldownRow,
)
SELECT_PAUSES = Query(
    select(AdmissionPause.lane, AdmissionPause.provider, AdmissionPause.model, AdmissionPause.since).order_by(
        AdmissionPause.lane, AdmissionPause.provider, AdmissionPause.model
    ),
    PauseRow,
)
SELECT_CREDITS = Query(select(LaneCredit.lane, LaneCredit.credits), CreditRow)
DELETE_CREDITS = Statement(delete(LaneCredit))
INSERT_CREDIT = Statement(insert(LaneCredit).values(lane=P("lane"), credits=P("credits")))

# --- the index against the queue (``db check``) ------------------------------------------------------

_QUEUED_READY = (
    "SELECT r.request_id, r.lane, r.provider, r.model, r.agent_id, r.session_id, r.enqueued_at FROM turn_requests r "
    "WHERE r.state = 'queued' AND EXISTS (SELECT 1 FROM turn_payloads p WHERE p.request_id = r.request_id)"
)
_ENTRIES = "SELECT request_id, lane, provider, model, agent_id, session_id, enqueued_at FROM queue_entries"


def _heads(source: str, group: str, head: tuple[str, str]) -> str:
    """Each group of ``source`` with its oldest member, as the head table must hold it."""
    at, request = head
    return (
        f"SELECT {group}, s.{at}, s.{request} FROM ({source}) s WHERE NOT EXISTS (SELECT 1 FROM ({source}) o WHERE "
        + " AND ".join(f"o.{column} = s.{column}" for column in group.split(", "))
        + f" AND (o.{at}, o.{request}) < (s.{at}, s.{request}))"
    )


_SESSION_GROUP, _AGENT_GROUP, _KEY_GROUP = (
    "lane, provider, model, agent_id, session_id",
    "lane, provider, model, agent_id",
    "lane, provider, model",
)
#: ``(what, expected rows, actual rows)``: each pair must hold the same rows (compared both ways).
INDEX_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("queue_entries", _QUEUED_READY, _ENTRIES),
    (
        "queue_sessions",
        _heads(_ENTRIES, _SESSION_GROUP, ("enqueued_at", "request_id")),
        f"SELECT {_SESSION_GROUP}, head_enqueued_at, head_request_id FROM queue_sessions",
    ),
    (
        "queue_agents",
        _heads("SELECT * FROM queue_sessions", _AGENT_GROUP, ("head_enqueued_at", "head_request_id")),
        f"SELECT {_AGENT_GROUP}, head_enqueued_at, head_request_id FROM queue_agents",
    ),
    (
        "queue_keys",
        _heads("SELECT * FROM queue_agents", _KEY_GROUP, ("head_enqueued_at", "head_request_id")),
        f"SELECT {_KEY_GROUP}, head_enqueued_at, head_request_id FROM queue_keys",
    ),
)
