"""Entering the queue: a request's metadata, the connector that enqueued it, and leaving before admission.

It also keeps the record of the connector that admits a request (:func:`record_admitting_owner`):
the identity the reaper judges a lease's holder by before any dispatch evidence exists.
"""

from __future__ import annotations

from typing import Any

import attrs

from .. import _validate as v
from ..errors import (
    AdmissionConflictError,
    AdmissionStateError,
    InvalidInputError,
    SessionLimitError,
    UnknownRequestError,
)
from ..evidence import ConnectorIdentity
from ..policy import Policy
from ..states import ABSENT, EventKind, RequestState
from ..store.rows import RequestMeta, RequestStatus, as_params
from ..store.statements.requests import (
    BIND_QUEUED_OWNER,
    COUNT_SESSION_OPEN,
    INSERT_QUEUED_OWNER,
    INSERT_REQUEST,
    LEASE_EXISTS_FOR_REQUEST,
    RECORD_OWNER,
    SELECT_QUEUED_OWNER,
    SELECT_REQUEST_META,
    SELECT_REQUEST_STATUS,
    SENT_REQUEST,
    SESSION_LOCK,
)
from ..store.tx import Tx
from ..store.unit_of_work import Gate
from ..values import EnqueueResult
from ..values import estimated_tokens as check_estimated_tokens
from . import _budgets, _journal, _policy
from ._context import PlaneContext
from ._transitions import QueuedRequest, change

S = RequestState


@attrs.frozen
class Metadata:
    """A request's immutable metadata, validated."""

    request_id: str
    session_id: str
    agent_id: str
    fingerprint: str
    provider: str
    model: str
    #: The lane named at enqueue; ``None``: the policy's default lane.
    lane: str | None = None
    #: The estimated token cost budgets reserve at admission; ``None``: no estimate.
    estimated_tokens: int | None = None

    def stored(self, lane: str) -> RequestMeta:
        """As :data:`SELECT_REQUEST_META` returns it, to compare with a stored request."""
        return RequestMeta(self.session_id, self.agent_id, self.fingerprint, self.provider, self.model, lane)


def metadata(
    request_id: str,
    session_id: str,
    agent_id: str,
    fingerprint: str,
    provider: str,
    model: str,
    now: int,
    lane: str | None = None,
    estimated_tokens: object = None,
) -> Metadata:
    """Validate an enqueue's arguments in the original's order (each failure its own message).

    Each text field meets the one rule the recovery inventory reads it back with
    (:func:`admission_plane._validate.request_field`, through
    :func:`~admission_plane._validate.request_metadata`, which the turn API checks too), so
    no accepted request can later make recovery refuse its row.
    """
    v.request_metadata(request_id, session_id, agent_id, fingerprint, provider, model)
    if not v.is_safe_integer(now) or now < 0:
        raise InvalidInputError("invalid request timestamp")
    # The original reports this through its journal, after the other checks, before any write.
    v.identifier(request_id, "event correlation input")
    if lane is not None:
        v.identifier(lane, "request lane")
    tokens = check_estimated_tokens(estimated_tokens)
    return Metadata(request_id, session_id, agent_id, fingerprint, provider, model, lane, tokens)


def owner(ctx: PlaneContext, owner_identity: ConnectorIdentity | None) -> ConnectorIdentity:
    """The connector an enqueue binds the request to (default: this plane's)."""
    if owner_identity is None:
        return ctx.owner_identity
    if not isinstance(owner_identity, ConnectorIdentity):
        raise InvalidInputError("owner identity must be a ConnectorIdentity")
    return owner_identity


def enqueue(ctx: PlaneContext, meta: Metadata, connector: ConnectorIdentity, now: int) -> EnqueueResult:
    """Queue a request without a payload (idempotent for the same metadata)."""
    ctx.keys.require_content()

    def work(tx: Tx) -> EnqueueResult:
        result, _lane = insert_request(ctx, tx, meta, connector, now)
        bind_owner(ctx, tx, meta.request_id, connector, now, result.existed, created=not result.existed)
        return result

    def sent(tx: Tx) -> EnqueueResult:
        if send_request(ctx, tx, meta, connector, now) is None:
            return work(tx)
        return EnqueueResult(meta.request_id, False)

    return ctx.run_sent(sent, work, gate=ENQUEUE_GATE)


#: How an enqueue takes the PostgreSQL gates: the admission gate shared, beside lease units and other
#: enqueues, never beside an admission. What it writes is the new request's own rows, its connector's
#: record and its place in the admission index; nothing it reads can be changed by a unit running beside it but
#: the same request or connector enqueued at the same moment (``ON CONFLICT DO NOTHING``, then a
#: comparison, as for a replay) and a session's count under a refusing per-session limit (the
#: session lock). The index's group heads are lowered by upserts, each one row's atomic minimum, so
#: two enqueues of one group end with the older head. Admission, which reads the index, never runs
#: beside an enqueue (see :mod:`admission_plane.store.unit_of_work`).
ENQUEUE_GATE = Gate.ENQUEUE


def insert_request(
    ctx: PlaneContext, tx: Tx, meta: Metadata, connector: ConnectorIdentity, now: int
) -> tuple[EnqueueResult, str]:
    """Insert the request (``absent -> queued``, bound to ``connector``: :func:`bind_owner` with ``created``
    then records the connector only), or accept an exact replay of it; and its lane.

    The policy in force decides the lane (it must name it), the queue deadline and, for a
    policy that refuses requests beyond the per-session limit, whether the session has room.

    A replay is answered before any of those checks, as the original does (an exact replay
    succeeds even under a policy that would now refuse the request), but the stored request
    is read only when it can exist: the insert goes first (``ON CONFLICT DO NOTHING``) and a
    conflict, or a refusal by a check, reads it. A new request thus costs no read (one round
    trip fewer on PostgreSQL, one statement fewer under SQLite's write lock).
    """
    policy = _policy.effective(ctx, tx).policy
    lane = policy.default_lane if meta.lane is None else meta.lane
    try:
        _admissible(tx, policy, meta, lane)
    except (InvalidInputError, SessionLimitError):  # a refusal; a replay is answered first
        existing = tx.one(SELECT_REQUEST_META, {"request_id": meta.request_id})
        if existing is not None:
            return _replay(tx, meta, lane, existing), lane
        raise
    params = {
        **as_params(meta),
        **_bound(connector, now),
        "lane": lane,
        "now": now,
        "deadline_at": now + policy.queue_timeout_ms,
    }
    if tx.execute(INSERT_REQUEST, params) == 0:  # stored already (a replay, or the same request enqueued beside it)
        return _replay(tx, meta, lane, tx.one(SELECT_REQUEST_META, {"request_id": meta.request_id})), lane
    _budgets.store_estimate(tx, meta.request_id, meta.estimated_tokens)
    _journal.record(ctx, tx, EventKind.REQUEST_ENQUEUED, meta.request_id, ABSENT, S.QUEUED, now)
    return EnqueueResult(meta.request_id, False), lane


def send_request(ctx: PlaneContext, tx: Tx, meta: Metadata, connector: ConnectorIdentity, now: int) -> str | None:
    """PostgreSQL with the session functions: :func:`insert_request` and the owner's binding for an enqueue that
    reads nothing first, sent with the unit's commit (``SENT_REQUEST``) and checked on the server: the request
    is new, and the durable policy is at the revision whose policy (``PlaneContext.policy_seen``) admitted it
    here. The request's lane; ``None`` when the enqueue cannot be sent so (``connector`` not this plane's
    recorded one, a lane or estimate that policy refuses, a session limit that refuses, which must count the
    session's requests): the caller then takes the long way in the same unit. When the server refuses, the
    commit raises :class:`~admission_plane.store.unit_of_work.SentUnitRefused`, nothing is committed, and the
    long way answers (a replay, a conflict, the revision's refusal)."""
    if connector is not ctx.owner_identity or not ctx.owner_recorded:
        return None
    revision, policy = ctx.policy_seen
    lane = policy.default_lane if meta.lane is None else meta.lane
    if all(known.name != lane for known in policy.lanes):
        return None
    if policy.max_turns_per_session is not None and policy.session_overflow == "refuse":
        return None
    try:
        _budgets.check_estimate(policy, meta.provider, meta.model, meta.estimated_tokens)
    except InvalidInputError:
        return None
    deadline = now + policy.queue_timeout_ms
    params = {**as_params(meta), **_bound(connector, now), "lane": lane, "now": now, "deadline_at": deadline}
    tx.send(SENT_REQUEST, {**params, "revision": revision})
    _budgets.store_estimate(tx, meta.request_id, meta.estimated_tokens)
    _journal.record(ctx, tx, EventKind.REQUEST_ENQUEUED, meta.request_id, ABSENT, S.QUEUED, now)
    bind_owner(ctx, tx, meta.request_id, connector, now, False, created=True)
    return lane


def _bound(connector: ConnectorIdentity, now: int) -> dict[str, object]:
    """A new request's binding to the connector that enqueues it, written by its insert."""
    return {"queued_owner_instance_id": connector.owner_instance_id, "queued_owner_recorded_at": now}


def _admissible(tx: Tx, policy: Policy, meta: Metadata, lane: str) -> None:
    """Refuse a new request the policy cannot queue: an unknown lane, a full session (when the policy
    refuses), an estimate no budget window could hold. Writes nothing (PostgreSQL may take the session lock)."""
    if all(known.name != lane for known in policy.lanes):
        raise InvalidInputError("request lane is not a lane of the admission policy")
    limit = policy.max_turns_per_session
    if limit is not None and policy.session_overflow == "refuse":
        if tx.shared:  # enqueues of one session must not count side by side
            tx.execute(SESSION_LOCK, {"session_id": meta.session_id})
        held = tx.scalar(COUNT_SESSION_OPEN, {"session_id": meta.session_id, "limit": limit}) or 0
        if held >= limit:
            raise SessionLimitError()
    _budgets.check_estimate(policy, meta.provider, meta.model, meta.estimated_tokens)


def _replay(tx: Tx, meta: Metadata, lane: str, stored: RequestMeta | None) -> EnqueueResult:
    """An enqueue of a request already stored: the same metadata and estimate, or a conflict."""
    if stored != meta.stored(lane) or _budgets.stored_estimate(tx, meta.request_id) != meta.estimated_tokens:
        raise AdmissionConflictError()
    return EnqueueResult(meta.request_id, True)


def bind_owner(
    ctx: PlaneContext,
    tx: Tx,
    request_id: str,
    connector: ConnectorIdentity,
    now: int,
    request_existed: bool,
    status: RequestStatus | None = None,
    *,
    created: bool = False,
) -> None:
    """Record ``connector`` and bind the queued request to it (so its death can be settled).

    ``status`` is the request's row when the caller already read and checked it here; ``created``:
    the caller's transaction inserted the request (:func:`insert_request`), queued and bound to ``connector``
    already, so only the connector's record is left to write.
    """
    # This plane's own record, once seen committed, is never read again (a record is never deleted).
    known = connector is ctx.owner_identity and ctx.owner_recorded
    stored = None if known else tx.one(SELECT_QUEUED_OWNER, {"owner_instance_id": connector.owner_instance_id})
    values = _owner_values(connector)
    if (
        stored is None
        and not known
        and tx.execute(INSERT_QUEUED_OWNER, {**values, "now": now, "host_id": ctx.host_id}) == 0
    ):
        # PostgreSQL: recorded at this very moment by another enqueue of the same connector.
        stored = tx.one(SELECT_QUEUED_OWNER, {"owner_instance_id": connector.owner_instance_id})
        if stored is None:
            raise AdmissionConflictError()
    if stored is not None:
        if as_params(stored) != values:
            raise AdmissionConflictError()
        if connector is ctx.owner_identity:
            ctx.owner_recorded = True
    if created:
        return  # bound by its insert
    if status is None:
        status = require_queued(tx, request_id)
    if status.queued_owner_instance_id == connector.owner_instance_id:
        return
    if status.queued_owner_instance_id is not None:
        # Another connector enqueued it first; a replay keeps that first binding.
        if request_existed:
            return
        raise AdmissionConflictError()
    params = {"request_id": request_id, "owner_instance_id": connector.owner_instance_id, "now": now}
    if tx.execute(BIND_QUEUED_OWNER, params) != 1:
        raise AdmissionConflictError()


def record_admitting_owner(ctx: PlaneContext, tx: Tx, owner_instance_id: str, now: int) -> None:
    """Record this plane's connector identity when it admits under its own owner instance.

    Until the connector records a dispatch intent, this record is the only evidence of the
    process that holds the lease (a connector that enqueued its request recorded it then).
    A record is never deleted, so once one is seen the plane stops looking.
    """
    identity = ctx.owner_identity
    if ctx.owner_recorded or owner_instance_id != identity.owner_instance_id:
        return
    if tx.one(SELECT_QUEUED_OWNER, {"owner_instance_id": owner_instance_id}) is not None:
        ctx.owner_recorded = True
        return
    tx.execute(RECORD_OWNER, {**_owner_values(identity), "now": now, "host_id": ctx.host_id})


def require_queued(tx: Tx, request_id: str) -> RequestStatus:
    """The request's status; refuses an unknown or no longer queued request."""
    status = tx.one(SELECT_REQUEST_STATUS, {"request_id": request_id})
    if status is None:
        raise UnknownRequestError()
    if status.state != S.QUEUED:
        raise AdmissionStateError("request is no longer queued")
    return status


def cancel_queued(ctx: PlaneContext, request_id: str, now: int) -> None:
    """Cancel a request that is still queued."""
    v.identifier(request_id, "cancel request ID")
    v.timestamp(now, "cancel timestamp")

    def work(tx: Tx) -> None:
        require_queued(tx, request_id)
        change(ctx, tx, QueuedRequest(request_id), EventKind.REQUEST_CANCELLED, S.CANCELLED, now)

    ctx.run(work)


def settle_owner_death(ctx: PlaneContext, request_id: str, owner_instance_id: str, now: int) -> bool:
    """Cancel a queued request whose (proved dead) owner enqueued it; ``False`` if anything changed meanwhile."""
    v.identifier(request_id, "queued owner request ID")
    v.identifier(owner_instance_id, "queued owner instance ID")
    v.timestamp(now, "queued owner death timestamp")

    def work(tx: Tx) -> bool:
        status = tx.one(SELECT_REQUEST_STATUS, {"request_id": request_id})
        if status is None or status.state != S.QUEUED or status.queued_owner_instance_id != owner_instance_id:
            return False
        if tx.exists(LEASE_EXISTS_FOR_REQUEST, {"request_id": request_id}):
            return False
        return change(ctx, tx, QueuedRequest(request_id), EventKind.QUEUED_OWNER_DEAD, S.CANCELLED, now)

    return ctx.run(work)


def _owner_values(connector: ConnectorIdentity) -> dict[str, Any]:
    process = connector.process
    return {
        "owner_instance_id": connector.owner_instance_id,
        "created_at": connector.created_at,
        "boot_id": process.boot_id,
        "pid": process.pid,
        "start_time_ticks": process.start_time_ticks,
        "pid_namespace_inode": process.pid_namespace_inode,
        "ppid": process.ppid,
        "pgrp": process.pgrp,
        "session": process.session,
    }
