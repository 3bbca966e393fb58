"""Every SQL statement of the service, built once from the entities.

Parameters are named bind parameters (``bindparam("now")``); constants are rendered as
literals so a compiled statement needs nothing but its named arguments. The admission
rule lives in :data:`SELECT_CANDIDATE_IDLE_AGENT` / :data:`SELECT_CANDIDATE_ANY`.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import and_, bindparam, delete, exists, func, insert, literal_column, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from ._sql import Statement
from .model import (
    Cooldown,
    Event,
    Lease,
    LeaseProcessIdentity,
    PolicyState,
    QueuedOwnerInstance,
    StartHistory,
    TurnPayload,
    TurnRequest,
)
from .states import SEAT_PHASES, START_WINDOW_PHASES, STARTING_PHASES, RequestState

S = RequestState
P = bindparam


def lit(value: str) -> ColumnElement[str]:
    """A constant string rendered inline (values come from our own enums, never from input)."""
    return literal_column("'" + value.replace("'", "''") + "'")


def one_of(column: ColumnElement[str], values: Iterable[str]) -> ColumnElement[bool]:
    return column.in_([lit(value) for value in sorted(values)])


R, L, C, PL, LPI, SH, EV, PS, QO = (
    TurnRequest,
    Lease,
    Cooldown,
    TurnPayload,
    LeaseProcessIdentity,
    StartHistory,
    Event,
    PolicyState,
    QueuedOwnerInstance,
)


def _fenced(statement):  # type: ignore[no-untyped-def]
    return statement.where(
        L.lease_id == P("lease_id"), L.owner_instance_id == P("owner_instance_id"), L.generation == P("generation")
    )


# --- requests and payloads ---------------------------------------------------------------

SELECT_REQUEST_META = Statement(
    select(R.session_id, R.agent_id, R.fingerprint, R.provider, R.model).where(R.request_id == P("request_id"))
)
SELECT_REQUEST = Statement(
    select(
        R.request_id, R.session_id, R.agent_id, R.fingerprint, R.provider, R.model, R.state, R.enqueued_at
    ).where(R.request_id == P("request_id"))
)
SELECT_REQUEST_STATE = Statement(
    select(R.state, R.queued_owner_instance_id).where(R.request_id == P("request_id"))
)
INSERT_REQUEST = Statement(
    insert(R).values(
        request_id=P("request_id"),
        session_id=P("session_id"),
        agent_id=P("agent_id"),
        fingerprint=P("fingerprint"),
        provider=P("provider"),
        model=P("model"),
        state=lit(S.QUEUED),
        enqueued_at=P("now"),
        deadline_at=P("deadline_at"),
    )
)
SET_REQUEST_STATE = Statement(update(R).where(R.request_id == P("request_id")).values(state=P("state")))
SET_REQUEST_TERMINAL = Statement(
    update(R).where(R.request_id == P("request_id")).values(state=P("state"), terminal_at=P("now"))
)
CANCEL_QUEUED = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == lit(S.QUEUED))
    .values(state=lit(S.CANCELLED), terminal_at=P("now"))
)
SELECT_PAYLOAD_FINGERPRINT = Statement(
    select(PL.content_fingerprint).where(PL.request_id == P("request_id"))
)
SELECT_PAYLOAD = Statement(
    select(PL.nonce, PL.ciphertext, PL.auth_tag, PL.key_version, PL.content_fingerprint, PL.expires_at).where(
        PL.request_id == P("request_id")
    )
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
DELETE_PAYLOAD = Statement(delete(PL).where(PL.request_id == P("request_id")))

# --- queued owners -------------------------------------------------------------------------

SELECT_QUEUED_OWNER = Statement(
    select(
        QO.owner_instance_id, QO.created_at, QO.boot_id, QO.pid, QO.start_time_ticks,
        QO.pid_namespace_inode, QO.ppid, QO.pgrp, QO.session,
    ).where(QO.owner_instance_id == P("owner_instance_id"))
)
INSERT_QUEUED_OWNER = Statement(
    insert(QO).values(
        owner_instance_id=P("owner_instance_id"),
        created_at=P("created_at"),
        boot_id=P("boot_id"),
        pid=P("pid"),
        start_time_ticks=P("start_time_ticks"),
        pid_namespace_inode=P("pid_namespace_inode"),
        ppid=P("ppid"),
        pgrp=P("pgrp"),
        session=P("session"),
        recorded_at=P("now"),
        host_id=P("host_id"),
    )
)
BIND_QUEUED_OWNER = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == lit(S.QUEUED), R.queued_owner_instance_id.is_(None))
    .values(queued_owner_instance_id=P("owner_instance_id"), queued_owner_recorded_at=P("now"))
)
LIST_QUEUED_OWNERS = Statement(
    select(
        R.request_id, QO.owner_instance_id, QO.created_at, QO.boot_id, QO.pid, QO.start_time_ticks,
        QO.pid_namespace_inode, QO.ppid, QO.pgrp, QO.session, QO.host_id,
    )
    .join(QO, QO.owner_instance_id == R.queued_owner_instance_id)
    .where(R.state == lit(S.QUEUED), R.queued_owner_instance_id.is_not(None))
    .order_by(R.enqueued_at, R.request_id)
)
LEASE_EXISTS_FOR_REQUEST = Statement(select(literal_column("1")).where(L.request_id == P("request_id")).limit(1))
SETTLE_QUEUED_OWNER = Statement(
    update(R)
    .where(
        R.request_id == P("request_id"),
        R.state == lit(S.QUEUED),
        R.queued_owner_instance_id == P("owner_instance_id"),
        ~exists().where(L.request_id == R.request_id),
    )
    .values(state=lit(S.CANCELLED), terminal_at=P("now"))
)

# --- admission -----------------------------------------------------------------------------

SELECT_EXPIRED = Statement(
    select(R.request_id)
    .where(R.state == lit(S.QUEUED), R.deadline_at <= P("now"))
    .order_by(R.request_id)
)
ANY_EXPIRED = Statement(
    select(literal_column("1")).where(R.state == lit(S.QUEUED), R.deadline_at <= P("now")).limit(1)
)
TIME_OUT_REQUEST = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == lit(S.QUEUED))
    .values(state=lit(S.QUEUE_TIMEOUT), terminal_at=P("now"))
)
COUNT_SEAT_LEASES = Statement(select(func.count()).select_from(L).where(one_of(L.phase, SEAT_PHASES)))
COUNT_START_WINDOW_LEASES = Statement(
    select(func.count()).select_from(L).where(one_of(L.phase, START_WINDOW_PHASES))
)
COUNT_STARTING_LEASES = Statement(select(func.count()).select_from(L).where(one_of(L.phase, STARTING_PHASES)))
RECENT_START = Statement(select(literal_column("1")).where(SH.started_at > P("cutoff")).limit(1))
RECENT_RESERVATION = Statement(
    select(literal_column("1"))
    .where(one_of(L.phase, START_WINDOW_PHASES), L.acquired_at > P("cutoff"))
    .limit(1)
)

_queued_with_payload = and_(
    R.state == lit(S.QUEUED),
    exists().where(PL.request_id == R.request_id, PL.content_fingerprint.is_not(None)),
)
_not_cooling = ~exists().where(C.provider == R.provider, C.model == R.model, C.not_before > P("now"))
_busy_agent = (
    select(literal_column("1"))
    .select_from(L)
    .join(TurnRequest.__table__.alias("holder"), literal_column("holder.request_id") == L.request_id)
    .where(one_of(L.phase, SEAT_PHASES), literal_column("holder.agent_id") == R.agent_id)
    .exists()
)

# The admission rule: the oldest queued request that has a payload and whose
# provider/model is not cooling down, preferring agents with no seat-holding lease.
# Both statements walk turn_requests_queue (state, enqueued_at) in order and stop at the
# first match, so their cost does not grow with queue depth.
SELECT_CANDIDATE_IDLE_AGENT = Statement(
    select(R.request_id, R.lease_generation)
    .where(_queued_with_payload, _not_cooling, ~_busy_agent)
    .order_by(R.enqueued_at, R.request_id)
    .limit(1)
)
SELECT_CANDIDATE_ANY = Statement(
    select(R.request_id, R.lease_generation)
    .where(_queued_with_payload, _not_cooling)
    .order_by(R.enqueued_at, R.request_id)
    .limit(1)
)
RESERVE_REQUEST = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == lit(S.QUEUED))
    .values(state=lit(S.ADMITTED), lease_generation=P("generation"))
)
INSERT_LEASE = Statement(
    insert(L).values(
        lease_id=P("lease_id"),
        request_id=P("request_id"),
        generation=P("generation"),
        owner_instance_id=P("owner_instance_id"),
        phase=lit(S.ADMITTED),
        acquired_at=P("now"),
        heartbeat_at=P("now"),
    )
)

# --- queue snapshot ------------------------------------------------------------------------

SELECT_QUEUED_ENTRY = Statement(
    select(R.enqueued_at, R.provider, R.model).where(R.request_id == P("request_id"), _queued_with_payload)
)
_ahead = tuple_(R.enqueued_at, R.request_id) <= tuple_(P("enqueued_at"), P("request_id"))
COUNT_AHEAD = Statement(select(func.count()).select_from(R).where(_queued_with_payload, _ahead))
COUNT_ELIGIBLE_AHEAD = Statement(
    select(func.count()).select_from(R).where(_queued_with_payload, _not_cooling, _ahead)
)
# A waiting connector's place, for deciding when to look again (see ``_doorbell``).
WAITER_ENTRY = Statement(
    select(R.enqueued_at, R.agent_id, R.provider, R.model).where(R.request_id == P("request_id"), _queued_with_payload)
)
AGENT_HOLDS_SEAT = Statement(
    select(literal_column("1"))
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
COUNT_IDLE_AGENTS_AHEAD = Statement(select(func.count(_idle_ahead.c.agent_id.distinct())))
COOLDOWN_UNTIL = Statement(
    select(C.not_before).where(C.provider == P("provider"), C.model == P("model"), C.not_before > P("now"))
)

# --- leases ----------------------------------------------------------------------------------

SELECT_LEASE = Statement(
    select(L.lease_id, L.request_id, L.generation, L.owner_instance_id, L.phase).where(L.lease_id == P("lease_id"))
)
SET_LEASE_PHASE = Statement(_fenced(update(L)).values(phase=P("phase"), heartbeat_at=P("now")))
DELETE_LEASE = Statement(_fenced(delete(L)))
LEASE_TO_RECOVERY = Statement(
    _fenced(update(L)).values(phase=lit(S.RECOVERY_REQUIRED), heartbeat_at=P("now"))
)
HEARTBEAT = Statement(
    _fenced(update(L)).values(heartbeat_at=P("now"), suspect_since=None, suspect_reason=None)
)
MARK_SUSPECT = Statement(
    _fenced(update(L)).values(
        suspect_since=func.coalesce(L.suspect_since, P("now")), suspect_reason=P("reason")
    )
)
DELETE_OLD_STARTS = Statement(delete(SH).where(SH.started_at < P("cutoff")))
LATEST_START = Statement(select(SH.started_at).order_by(SH.started_at.desc()).limit(1))
LATEST_RESERVATION = Statement(select(func.max(L.acquired_at)).where(one_of(L.phase, START_WINDOW_PHASES)))
INSERT_START = Statement(insert(SH).values(lease_id=P("lease_id"), started_at=P("now")))

_cooldown_values = {
    "provider": P("provider"),
    "model": P("model"),
    "not_before": P("not_before"),
    "updated_at": P("now"),
}
_sqlite_upsert = sqlite.insert(C).values(**_cooldown_values)
_postgres_upsert = postgresql.insert(C).values(**_cooldown_values)
UPSERT_COOLDOWN = Statement(
    _sqlite_upsert.on_conflict_do_update(
        index_elements=[C.provider, C.model],
        set_={
            "not_before": func.max(C.not_before, _sqlite_upsert.excluded.not_before),
            "updated_at": func.max(C.updated_at, _sqlite_upsert.excluded.updated_at),
        },
    ),
    postgresql=_postgres_upsert.on_conflict_do_update(
        index_elements=[C.provider, C.model],
        set_={
            "not_before": func.greatest(C.not_before, _postgres_upsert.excluded.not_before),
            "updated_at": func.greatest(C.updated_at, _postgres_upsert.excluded.updated_at),
        },
    ),
)

# --- dispatch intent -------------------------------------------------------------------------

_IDENTITY_COLUMNS = (
    LPI.request_id, LPI.lease_generation, LPI.owner_instance_id, LPI.prompt_channel,
    LPI.connector_owner_instance_id, LPI.connector_created_at, LPI.connector_boot_id, LPI.connector_pid,
    LPI.connector_start_time_ticks, LPI.connector_pid_namespace_inode, LPI.connector_ppid, LPI.connector_pgrp,
    LPI.connector_session, LPI.child_boot_id, LPI.child_pid, LPI.child_start_time_ticks,
    LPI.child_pid_namespace_inode, LPI.child_ppid, LPI.child_pgrp, LPI.child_session,
)
IDENTITY_COLUMN_NAMES = tuple(column.key for column in _IDENTITY_COLUMNS)
SELECT_IDENTITY = Statement(select(*_IDENTITY_COLUMNS).where(LPI.lease_id == P("lease_id")))
INSERT_IDENTITY = Statement(
    insert(LPI).values(
        lease_id=P("lease_id"),
        recorded_at=P("now"),
        host_id=P("host_id"),
        **{name: P(name) for name in IDENTITY_COLUMN_NAMES},
    )
)
LEASE_TO_DISPATCH_INTENT = Statement(
    _fenced(update(L)).where(L.phase == lit(S.STARTING)).values(
        phase=lit(S.DISPATCH_INTENT), heartbeat_at=P("now")
    )
)
REQUEST_TO_DISPATCH_INTENT = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.lease_generation == P("generation"), R.state == lit(S.STARTING))
    .values(state=lit(S.DISPATCH_INTENT))
)
SELECT_LEASE_WITH_REQUEST = Statement(
    select(
        L.lease_id, L.request_id, L.generation, L.owner_instance_id, L.phase,
        R.state, R.lease_generation,
    )
    .join(R, R.request_id == L.request_id)
    .where(L.lease_id == P("lease_id"))
)

# --- journal -----------------------------------------------------------------------------------

INSERT_EVENT = Statement(
    insert(EV).values(
        kind=P("kind"),
        from_state=P("from_state"),
        to_state=P("to_state"),
        occurred_at=P("now"),
        correlation_hmac=P("correlation_hmac"),
    )
)
SELECT_EVENTS = Statement(
    select(EV.event_seq, EV.kind, EV.from_state, EV.to_state, EV.occurred_at, EV.correlation_hmac)
    .where(EV.event_seq > P("after"))
    .order_by(EV.event_seq)
    .limit(P("limit"))
)

# --- recovery inventory --------------------------------------------------------------------------

LIST_DISPATCHES = Statement(
    select(
        L.lease_id, L.request_id, L.generation, L.owner_instance_id, L.phase, L.heartbeat_at,
        R.request_id, R.session_id, R.provider, R.model, R.state, R.lease_generation, R.enqueued_at,
        LPI.lease_id, *_IDENTITY_COLUMNS, LPI.host_id,
    )
    .select_from(L)
    .outerjoin(R, R.request_id == L.request_id)
    .outerjoin(LPI, LPI.lease_id == L.lease_id)
    .order_by(R.enqueued_at, R.request_id, L.lease_id)
)

# --- durable policy ------------------------------------------------------------------------------

_POLICY_COLUMNS = (
    PS.max_active_turns, PS.max_concurrent_starts, PS.min_start_interval_ms, PS.queue_timeout_ms,
    PS.capacity_cooldown_ms, PS.drain_state, PS.policy_fingerprint,
)
SELECT_POLICY = Statement(select(*_POLICY_COLUMNS).where(PS.id == 1))
INSERT_POLICY_IF_ABSENT = Statement(
    insert(PS).from_select(
        [
            "id", "max_active_turns", "max_concurrent_starts", "min_start_interval_ms", "queue_timeout_ms",
            "capacity_cooldown_ms", "drain_state", "policy_fingerprint", "updated_at",
            "updated_by_owner_instance_id",
        ],
        select(
            literal_column("1"), P("max_active_turns"), P("max_concurrent_starts"), P("min_start_interval_ms"),
            P("queue_timeout_ms"), P("capacity_cooldown_ms"), lit("steady"), P("policy_fingerprint"), P("now"),
            P("owner_instance_id"),
        ).where(~exists().where(PS.id == 1)),
    )
)
START_DRAIN = Statement(
    update(PS)
    .where(PS.id == 1, PS.drain_state == lit("steady"), PS.max_active_turns == 3)
    .values(drain_state=lit("soft_draining_to_1"), updated_at=P("now"), updated_by_owner_instance_id=P("owner"))
)
COMPLETE_DRAIN = Statement(
    update(PS)
    .where(PS.id == 1, PS.drain_state == lit("soft_draining_to_1"))
    .values(
        max_active_turns=1,
        max_concurrent_starts=P("max_concurrent_starts"),
        min_start_interval_ms=P("min_start_interval_ms"),
        queue_timeout_ms=P("queue_timeout_ms"),
        capacity_cooldown_ms=P("capacity_cooldown_ms"),
        drain_state=lit("steady"),
        policy_fingerprint=P("policy_fingerprint"),
        updated_at=P("now"),
        updated_by_owner_instance_id=P("owner"),
    )
)
