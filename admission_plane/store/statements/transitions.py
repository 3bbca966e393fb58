"""The statements every state change is made of (applied by ``service._transitions.change``).

Each update is guarded by the state it leaves, so a row that moved meanwhile is not
touched (the caller sees a row count of 0); lease updates are also fenced by lease id,
owner instance and generation.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Text,
    and_,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    update,
)

from ...states import DrainState, LeaseEffect
from ..model import BudgetCharge, Lease, LeaseProcessIdentity, TurnPayload, TurnRequest
from ..tx import Statement
from ._build import P, fenced
from .leases import START_WINDOW_COUNT
from .policy import durable_drain_state, durable_revision
from .queue import QUEUE_ADD_CALL

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


def _reservation(*guard: Any) -> tuple[Any, Any]:
    """The request reserved (``queued`` -> ``admitted``, its next generation; only where ``guard`` holds too) and
    its new lease, as data-modifying CTEs."""
    reserved = (
        update(R)
        .where(R.request_id == P("request_id"), R.state == P("source"), *guard)
        .values(state=P("target"), lease_generation=R.lease_generation + 1)
        .returning(R.request_id, R.lease_generation)
        .cte("reserved")
    )
    new_lease = (
        insert(L)
        .from_select(
            ["lease_id", "request_id", "generation", "owner_instance_id", "phase", "acquired_at", "heartbeat_at"],
            select(
                cast(P("lease_id"), Text),
                reserved.c.request_id,
                reserved.c.lease_generation,
                cast(P("owner_instance_id"), Text),
                cast(P("target"), Text),
                cast(P("now"), BigInteger),
                cast(P("now"), BigInteger),
            ),
        )
        .returning(L.lease_id)
        .cte("new_lease")
    )
    return reserved, new_lease


_reserved, _new_lease = _reservation()
#: PostgreSQL, a connection holding the session functions: ``RESERVE_REQUEST`` with the next
#: generation, ``INSERT_LEASE`` and the admission index's removal (``QUEUE_REMOVE``) as one
#: statement, inside the admission's lock. Its row: the new generation and the leases inserted
#: (no row: the request is no longer queued, and nothing changed).
ADMIT_REQUEST = Statement(
    select(
        _reserved.c.lease_generation,
        select(func.count()).select_from(_new_lease).scalar_subquery().label("leases"),
        func.pg_temp.admission_plane_queue_remove(_reserved.c.request_id).label("dequeued"),
    ).select_from(_reserved),
    only="postgresql",
)
_one = select(literal(1).label("one")).subquery("one")


def _sent_admit(reserved: Any, new_lease: Any, *, entering: bool = False) -> Statement:
    """The reservation sent with its commit: one row whatever happened (``_one``), the new generation in it. The
    reserved request leaves the admission index, and the server refuses the commit (``SENT_REFUSED``) unless the
    request was reserved and its lease inserted. ``entering``: an enqueue's try, whose request is not in the index
    yet: the server puts it there only if it did not reserve it, and the row counts the leases inserted instead
    (the unit commits either way)."""
    inserted = select(func.count()).select_from(new_lease).scalar_subquery()
    if entering:
        index = case((reserved.c.request_id.is_(None), QUEUE_ADD_CALL)).label("queued")
        last = inserted.label("leases")
    else:
        index = func.pg_temp.admission_plane_queue_remove(reserved.c.request_id).label("dequeued")
        last = func.pg_temp.admission_plane_expect_sent(inserted == 1).label("checked")
    return Statement(
        select(reserved.c.lease_generation, index, last).select_from(_one.outerjoin(reserved, true())),
        only="postgresql",
    )


#: ``ADMIT_REQUEST`` for an admission that sends its reservation with its commit and reads the new generation
#: after it (``Tx.send_returning``): one row whatever happened, whose check raises ``SENT_REFUSED`` (so nothing
#: commits) unless the request was reserved and its lease inserted. The row: the new generation.
SENT_ADMIT = _sent_admit(*_reservation())
#: What the caller of a blind admission assumed of the policy, and how it asks (after the request's place).
_ASSUMED = (
    cast(P("now"), BigInteger),
    cast(P("revision"), BigInteger),
    cast(P("default_seats"), BigInteger),
    cast(P("max_starts"), BigInteger),
    cast(P("parallel"), Boolean),
    cast(P("horizon"), BigInteger),
)
_blind_guard = func.pg_temp.admission_plane_blind_admissible(R.request_id, *_ASSUMED)
#: ``SENT_ADMIT`` for an admission that read nothing first (a waiter's, sent whole with its commit): the request
#: is reserved only where the server finds that the rule admits it now
#: (``pg_temp.admission_plane_blind_admissible``, :mod:`admission_plane.store.session_functions`), else the
#: check refuses the commit. Parameters beyond ``SENT_ADMIT``'s: ``revision``, ``default_seats``, ``max_starts``,
#: ``parallel`` and ``horizon`` (what the caller assumed of the policy, and how it asks).
SENT_BLIND_ADMIT = _sent_admit(*_reservation(_blind_guard))
_entering_guard = func.pg_temp.admission_plane_blind_admissible_new(
    R.request_id,
    cast(P("lane"), Text),
    cast(P("provider"), Text),
    cast(P("model"), Text),
    cast(P("agent_id"), Text),
    cast(P("enqueued_at"), BigInteger),
    *_ASSUMED,
)
#: ``SENT_BLIND_ADMIT`` for an enqueue that tries its new request's admission with it, in a unit that commits
#: whether or not the request is admitted: no check, and the request is not in the admission index yet (its
#: place is given: ``lane``, ``provider``, ``model``, ``agent_id``, ``session_id``, ``enqueued_at``). The server
#: decides as for a request in the index (``pg_temp.admission_plane_blind_admissible_new``), and puts the request
#: in the index only when it does not admit it (``QUEUE_ADD``): an admitted request is never indexed and
#: dequeued in one transaction (two calls and eight rows written fewer). Its row: the new generation, ``NULL``
#: when not admitted (and nothing of the admission was written; its journal event is inserted only if the lease
#: exists, ``INSERT_EVENT_IF_LEASE``).
SENT_BLIND_TRY = _sent_admit(*_reservation(_entering_guard), entering=True)
#: A queued request leaves the queue without a lease (cancelled, timed out, owner gone).
END_QUEUED_REQUEST = Statement(
    update(R)
    .where(R.request_id == P("request_id"), R.state == P("source"))
    .values(state=P("target"), terminal_at=P("now"))
)
SET_LEASE_PHASE_CONSTRUCT = (
    fenced(update(L)).where(L.phase == P("source")).values(phase=P("target"), heartbeat_at=P("now"))
)
SET_LEASE_PHASE = Statement(SET_LEASE_PHASE_CONSTRUCT)
DELETE_LEASE_CONSTRUCT = fenced(delete(L)).where(L.phase == P("phase"))
DELETE_LEASE = Statement(DELETE_LEASE_CONSTRUCT)
_leased_request = (R.request_id == P("request_id"), R.state == P("source"), R.lease_generation == P("generation"))
SET_REQUEST_STATE_CONSTRUCT = update(R).where(*_leased_request).values(state=P("target"))
SET_REQUEST_STATE = Statement(SET_REQUEST_STATE_CONSTRUCT)
END_LEASED_REQUEST_CONSTRUCT = update(R).where(*_leased_request).values(state=P("target"), terminal_at=P("now"))
END_LEASED_REQUEST = Statement(END_LEASED_REQUEST_CONSTRUCT)
DELETE_PAYLOAD_CONSTRUCT = delete(TurnPayload).where(TurnPayload.request_id == P("request_id"))
DELETE_PAYLOAD = Statement(DELETE_PAYLOAD_CONSTRUCT)


# --- PostgreSQL: one statement per lease edge -----------------------------------------------------
#
# On PostgreSQL the statements of one lease edge (the lease's update or delete, the request's
# update, the payload's delete) run as one statement of data-modifying CTEs, which answers
# how many rows each part changed (and, where the edge frees a seat, the drain state the
# caller needs next): one round trip instead of three or four. Every part sees the same
# snapshot and changes a different table, so the parts do not see each other's changes and
# need not. SQLite keeps the separate statements above.


def _count(cte: Any) -> Any:
    return select(func.count()).select_from(cte).scalar_subquery()


def _edge_counts(effect: LeaseEffect, terminal: bool) -> tuple[Any, Any]:
    """A lease edge's two writes as CTEs (the lease moved or deleted, its request's edge), counted."""
    if effect is LeaseEffect.MOVE:
        lease: Any = SET_LEASE_PHASE_CONSTRUCT
    elif effect is LeaseEffect.DELETE:
        lease = DELETE_LEASE_CONSTRUCT
    else:
        raise ValueError(f"no combined statement for {effect}")
    request = END_LEASED_REQUEST_CONSTRUCT if terminal else SET_REQUEST_STATE_CONSTRUCT
    leases = lease.returning(L.lease_id).cte("changed_lease")
    requests = request.returning(R.request_id).cte("changed_request")
    return _count(leases), _count(requests)


@functools.cache
def combined_edge(effect: LeaseEffect, terminal: bool, payload: bool) -> Statement:
    """The PostgreSQL statement of a lease edge: ``SELECT`` of the changed leases, requests,
    deleted payloads (when ``payload``) and, when the lease is deleted, the policy's drain state
    (``''``: no durable policy)."""
    leases, requests = _edge_counts(effect, terminal)
    columns = [leases.label("leases"), requests.label("requests")]
    if payload:
        payloads = DELETE_PAYLOAD_CONSTRUCT.returning(TurnPayload.request_id).cte("deleted_payload")
        columns.append(_count(payloads).label("payloads"))
    if effect is LeaseEffect.DELETE:
        columns.append(durable_drain_state().label("drain_state"))  # ``''``: no durable policy, nothing draining
    return Statement(select(*columns))


@functools.cache
def sent_edge(terminal: bool) -> Statement:
    """PostgreSQL, on a connection holding the session functions: a lease's phase move and its request's
    edge (no payload deleted), written as ``combined_edge(LeaseEffect.MOVE, terminal, False)`` writes them,
    but checked on the server (``pg_temp.admission_plane_expect_edge``, which raises unless exactly one
    lease and one request changed) instead of by the caller reading its counts. Nothing is read back, so a
    unit may send it with its commit (``Tx.send``); a refusal then aborts the commit. Only for a lease the
    unit has locked and checked against its fence and phase (``service._transitions.change(locked=True)``):
    the lease side cannot miss then, and the request side misses only in a damaged database."""
    leases, requests = _edge_counts(LeaseEffect.MOVE, terminal)
    check = func.pg_temp.admission_plane_expect_edge(leases, requests, cast(P("target"), Text))
    return Statement(select(check), only="postgresql")


@functools.cache
def sent_move(*, starting: bool = False, dispatch: bool = False) -> Statement:
    """PostgreSQL, a connection holding the session functions: a lease's phase move (no payload deleted) and its
    request's edge, for a unit that reads nothing first and sends all it writes with its commit
    (:meth:`admission_plane.service._context.PlaneContext.run_sent`). Checked on the server by
    ``pg_temp.admission_plane_expect_sent``, which raises ``SENT_REFUSED`` (so the commit carrying it commits
    nothing) unless exactly one lease matched its fence, the request it must name (``request_id``, which the
    caller holds from admission) and the phase it leaves (``source``), and that request moved; with
    ``starting``, also unless the start window holds no more than ``limit`` leases and the durable policy's
    revision is ``revision`` (0: none claimed, or none set); with ``dispatch``, also unless no process evidence
    is recorded for the lease. Every part reads the statement's snapshot, taken after the unit's gate, as
    the reads they replace did (``SELECT_START_READS``, ``SELECT_LEASE_FOR_DISPATCH``): a lease whose lock
    the statement waited for is read again, and a unit that moved it on meanwhile fails its phase guard."""
    leases = SET_LEASE_PHASE_CONSTRUCT.where(L.request_id == P("request_id")).returning(L.lease_id)
    requests = SET_REQUEST_STATE_CONSTRUCT.returning(R.request_id)
    held = [_count(leases.cte("changed_lease")) == 1, _count(requests.cte("changed_request")) == 1]
    if starting:
        held += [START_WINDOW_COUNT.scalar_subquery() <= P("limit"), durable_revision() == P("revision")]
    if dispatch:
        held.append(~exists().where(LeaseProcessIdentity.lease_id == P("lease_id")))
    return Statement(select(func.pg_temp.admission_plane_expect_sent(and_(*held))), only="postgresql")


@functools.cache
def sent_release() -> Statement:
    """PostgreSQL, a connection holding the session functions: the end of a live turn (the lease deleted, its
    request from ``source`` to its terminal ``target``), for a unit that reads nothing first and sends all it
    writes with its commit, as :func:`sent_move` does. The server raises ``SENT_REFUSED`` unless exactly one
    lease matched its fence, the request it must name (``request_id``) and the phase it leaves (``phase``), and
    that request moved, and unless freeing the seat needs nothing more: the request holds no budget reservation
    and no soft drain is pending (``unread_release`` reads both for the unit that settles them)."""
    leases = DELETE_LEASE_CONSTRUCT.where(L.request_id == P("request_id")).returning(L.lease_id)
    requests = END_LEASED_REQUEST_CONSTRUCT.returning(R.request_id)
    held = [
        _count(leases.cte("freed_lease")) == 1,
        _count(requests.cte("changed_request")) == 1,
        ~exists().where(BudgetCharge.charge_id == P("request_id")),
        durable_drain_state() != literal(DrainState.SOFT_DRAINING_TO_1.value),
    ]
    return Statement(select(func.pg_temp.admission_plane_expect_sent(and_(*held))), only="postgresql")


def _request_of(leases: Any, terminal: bool, payload: bool) -> tuple[Any, list[Any]]:
    """For a lease edge written as a CTE ``leases`` (returning ``request_id``): the update of the request it
    names (guarded by ``source`` and the lease's generation) and the delete of its payload (when ``payload``),
    as CTEs; the request CTE and the counts so far (leases, requests, payloads)."""
    guard = (
        R.request_id.in_(select(leases.c.request_id)),
        R.state == P("source"),
        R.lease_generation == P("generation"),
    )
    values = {"state": P("target"), "terminal_at": P("now")} if terminal else {"state": P("target")}
    requests = update(R).where(*guard).values(**values).returning(R.request_id).cte("changed_request")
    columns = [_count(leases).label("leases"), _count(requests).label("requests")]
    if payload:
        payloads = (
            delete(TurnPayload)
            .where(TurnPayload.request_id.in_(select(requests.c.request_id)))
            .returning(TurnPayload.request_id)
            .cte("deleted_payload")
        )
        columns.append(_count(payloads).label("payloads"))
    return requests, columns


@functools.cache
def unread_move(terminal: bool, payload: bool) -> Statement:
    """PostgreSQL: :func:`combined_edge` of a ``MOVE`` for a lease its unit has not read first. The lease's
    fenced update (guarded by the phase it leaves) comes first and locks its row; the request is the one
    the changed lease names, and the payload that request's, so when the fence or the phase does not
    match nothing changes (the caller then raises the refusal, which rolls the unit back as well). The
    row also holds the request's ID (``NULL``: no request changed)."""
    leases = SET_LEASE_PHASE_CONSTRUCT.returning(L.lease_id, L.request_id).cte("changed_lease")
    requests, columns = _request_of(leases, terminal, payload)
    columns.append(select(requests.c.request_id).limit(1).scalar_subquery().label("request_id"))
    return Statement(select(*columns), only="postgresql")


@functools.cache
def unread_release(payload: bool) -> Statement:
    """PostgreSQL: the end of a live turn in one statement, for a lease its unit has not read first.

    The lease's fenced delete (guarded by the phase it leaves) comes first and locks its row; the
    request it names goes from ``source`` straight to its terminal ``target`` (the unit journals the
    step between, ``provider_terminal``, which no other transaction could ever see), and its payload
    is deleted when ``payload``. When the fence or the phase does not match, nothing changes (the
    caller then reads the lease for the refusal). The row: leases deleted, requests changed, payloads
    deleted (when ``payload``), the policy's drain state (``''``: no durable policy), the request's ID
    and whether it held a budget reservation (``NULL`` for both: no lease deleted)."""
    charged = exists().where(BudgetCharge.charge_id == L.request_id).label("charged")
    leases = DELETE_LEASE_CONSTRUCT.returning(L.request_id, charged).cte("freed_lease")
    _requests, columns = _request_of(leases, True, payload)
    columns += [
        durable_drain_state().label("drain_state"),
        select(leases.c.request_id).limit(1).scalar_subquery().label("request_id"),
        select(leases.c.charged).limit(1).scalar_subquery().label("charged"),
    ]
    return Statement(select(*columns), only="postgresql")
