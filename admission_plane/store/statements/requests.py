"""Requests, their sealed payloads, and the connectors that enqueued (or admitted) them."""

from __future__ import annotations

from sqlalchemy import BigInteger, and_, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite

from ...states import OWNER_DEATH_PHASES, SEAT_PHASES, RequestState
from ..model import Lease, QueuedOwnerInstance, TurnPayload, TurnRequest
from ..rows import EntryRow, OwnerRow, PayloadRow, QueuedOwnerRow, RequestMeta, RequestRow, RequestStatus
from ..tx import Query, Scalar, Statement
from ._build import P, lit, one, one_of
from .policy import durable_revision

R, PL, QO = TurnRequest, TurnPayload, QueuedOwnerInstance
QUEUED = RequestState.QUEUED
#: The seed of the per-session enqueue lock's key (``hashtextextended(session_id, seed)``; "admsess").
SESSION_LOCK_SEED = 0x61646D73657373

SELECT_REQUEST_META = Query(
    select(R.session_id, R.agent_id, R.fingerprint, R.provider, R.model, R.lane).where(R.request_id == P("request_id")),
    RequestMeta,
)
SELECT_REQUEST = Query(
    select(R.request_id, R.session_id, R.agent_id, R.fingerprint, R.provider, R.model, R.state, R.enqueued_at).where(
        R.request_id == P("request_id")
    ),
    RequestRow,
)
SELECT_REQUEST_STATUS = Query(
    select(R.state, R.queued_owner_instance_id).where(R.request_id == P("request_id")), RequestStatus
)
_new_request = {
    "request_id": P("request_id"),
    "session_id": P("session_id"),
    "agent_id": P("agent_id"),
    "fingerprint": P("fingerprint"),
    "provider": P("provider"),
    "model": P("model"),
    "state": lit(QUEUED),
    "enqueued_at": P("now"),
    "deadline_at": P("deadline_at"),
    "lane": P("lane"),
    # Bound to the connector that enqueues it by the insert itself (``service._enqueue.bind_owner``): a turn's
    # request is never updated only to record its queued owner (``BIND_QUEUED_OWNER`` binds a stored request).
    "queued_owner_instance_id": P("queued_owner_instance_id"),
    "queued_owner_recorded_at": P("queued_owner_recorded_at"),
}
#: PostgreSQL: enqueues run side by side (``Gate.ENQUEUE``), so the same request enqueued twice at once
#: inserts once; the other finds no row inserted (row count 0) and compares, as a replay does.
#: A new request; nothing (row count 0) when one with its id is stored already.
_insert_request_pg = postgresql.insert(R).values(**_new_request).on_conflict_do_nothing(index_elements=[R.request_id])
INSERT_REQUEST = Statement(
    sqlite.insert(R).values(**_new_request).on_conflict_do_nothing(index_elements=[R.request_id]),
    postgresql=_insert_request_pg,
)
#: PostgreSQL, a connection holding the session functions: ``INSERT_REQUEST`` for an enqueue that reads nothing
#: first and sends all it writes with its commit (``service._enqueue.send_request``), checked on the server by
#: ``pg_temp.admission_plane_expect_sent``, which raises ``SENT_REFUSED`` (so nothing commits) unless the request
#: was inserted (a replay, or the same request enqueued beside it, inserts nothing) and the durable policy is at
#: the revision (``revision``; 0: none) whose policy the caller checked the request against.
_inserted = select(func.count()).select_from(_insert_request_pg.returning(R.request_id).cte("inserted_request"))
SENT_REQUEST = Statement(
    select(
        func.pg_temp.admission_plane_expect_sent(
            and_(_inserted.scalar_subquery() == 1, durable_revision() == P("revision"))
        )
    ),
    only="postgresql",
)
#: A session's requests still queued or holding a seat, counted up to ``limit`` (its limit at enqueue).
_open_states = (QUEUED, *sorted(SEAT_PHASES))
_session_open = (
    select(one())
    .select_from(R)
    .where(R.session_id == P("session_id"), one_of(R.state, _open_states))
    .limit(P("limit"))
    .subquery()
)
COUNT_SESSION_OPEN: Scalar[int] = Scalar(select(func.count()).select_from(_session_open))
#: What the admission index keeps of a queued request.
SELECT_ENTRY_OF_REQUEST = Query(
    select(R.lane, R.provider, R.model, R.agent_id, R.session_id, R.enqueued_at).where(
        R.request_id == P("request_id"), R.state == lit(QUEUED)
    ),
    EntryRow,
)

SELECT_PAYLOAD_FINGERPRINT: Scalar[str] = Scalar(select(PL.content_fingerprint).where(PL.request_id == P("request_id")))
SELECT_PAYLOAD = Query(
    select(PL.nonce, PL.ciphertext, PL.auth_tag, PL.key_version, PL.content_fingerprint, PL.expires_at).where(
        PL.request_id == P("request_id")
    ),
    PayloadRow,
)
INSERT_PAYLOAD = Statement(
    insert(PL).values(
        request_id=P("request_id"),
        nonce=P("nonce"),
        ciphertext=P("ciphertext"),
        auth_tag=P("auth_tag"),
        key_version=P("key_version"),
        content_fingerprint=P("content_fingerprint"),
        expires_at=P("expires_at"),
        created_at=P("now"),
    )
)

_OWNER_COLUMNS = (
    QO.owner_instance_id,
    QO.created_at,
    QO.boot_id,
    QO.pid,
    QO.start_time_ticks,
    QO.pid_namespace_inode,
    QO.ppid,
    QO.pgrp,
    QO.session,
)
SELECT_QUEUED_OWNER = Query(select(*_OWNER_COLUMNS).where(QO.owner_instance_id == P("owner_instance_id")), OwnerRow)
_new_owner = {
    **{column.key: P(column.key) for column in _OWNER_COLUMNS},
    "recorded_at": P("now"),
    "host_id": P("host_id"),
}
#: PostgreSQL: two enqueues of one connector at once record it once (the other compares it, row count 0).
INSERT_QUEUED_OWNER = Statement(
    insert(QO).values(**_new_owner),
    postgresql=postgresql.insert(QO).values(**_new_owner).on_conflict_do_nothing(index_elements=[QO.owner_instance_id]),
)
#: PostgreSQL: enqueues of one session under a policy that refuses requests beyond the session's
#: limit follow one another (they count the session's requests before inserting).
SESSION_LOCK = Statement(
    select(func.pg_advisory_xact_lock(func.hashtextextended(P("session_id"), literal(SESSION_LOCK_SEED, BigInteger))))
)
BIND_QUEUED_OWNER = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == lit(QUEUED), R.queued_owner_instance_id.is_(None))
    .values(queued_owner_instance_id=P("owner_instance_id"), queued_owner_recorded_at=P("now"))
)
LIST_QUEUED_OWNERS = Query(
    select(R.request_id, *_OWNER_COLUMNS, QO.host_id)
    .join(QO, QO.owner_instance_id == R.queued_owner_instance_id)
    .where(R.state == lit(QUEUED), R.queued_owner_instance_id.is_not(None))
    .order_by(R.enqueued_at, R.request_id),
    QueuedOwnerRow,
)
LEASE_EXISTS_FOR_REQUEST: Scalar[int] = Scalar(select(one()).where(Lease.request_id == P("request_id")).limit(1))

_owner_values = {
    **{column.key: P(column.key) for column in _OWNER_COLUMNS},
    "recorded_at": P("now"),
    "host_id": P("host_id"),
}
#: Record an admitting connector's identity unless its owner instance already has one (race-free).
RECORD_OWNER = Statement(
    sqlite.insert(QO).values(**_owner_values).on_conflict_do_nothing(index_elements=[QO.owner_instance_id]),
    postgresql=postgresql.insert(QO)
    .values(**_owner_values)
    .on_conflict_do_nothing(index_elements=[QO.owner_instance_id]),
)
#: The recorded identity of the connector holding each lease before its dispatch intent (keyed by request).
LIST_LEASE_HOLDERS = Query(
    select(Lease.request_id, *_OWNER_COLUMNS, QO.host_id)
    .join(QO, QO.owner_instance_id == Lease.owner_instance_id)
    .where(one_of(Lease.phase, OWNER_DEATH_PHASES))
    .order_by(Lease.request_id),
    QueuedOwnerRow,
)
