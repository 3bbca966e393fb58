"""The one function that changes a request's state or a lease's phase: :func:`change`.

It looks the edge up in :data:`admission_plane.states.TRANSITIONS`, refuses one the table
does not have, runs the edge's statements guarded by the state it leaves (and, for a
lease, by its fence), deletes the payload where the table says the prompt must be gone,
rings the doorbell for what the edge frees, and journals the event. Callers check their
own preconditions first (which phase they accept, with the original's messages) and read
the subject inside the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..errors import AdmissionRuntimeError, AdmissionStateError, LeaseFenceError
from ..states import (
    PAYLOAD_DELETED_STATES,
    POLICY_EVENT_ID,
    TERMINAL_STATES,
    DrainState,
    EventKind,
    LeaseEffect,
    RequestState,
    Transition,
    transition,
)
from ..store.doorbell import Bell
from ..store.rows import EntryRow, LeaseRow
from ..store.statements.policy import COMPLETE_DRAIN
from ..store.statements.transitions import (
    ADMIT_REQUEST,
    DELETE_LEASE,
    DELETE_PAYLOAD,
    END_LEASED_REQUEST,
    END_QUEUED_REQUEST,
    INSERT_LEASE,
    RESERVE_REQUEST,
    SENT_ADMIT,
    SENT_BLIND_ADMIT,
    SENT_BLIND_TRY,
    SET_LEASE_PHASE,
    SET_REQUEST_STATE,
    combined_edge,
    sent_edge,
    sent_move,
    sent_release,
    unread_move,
    unread_release,
)
from ..store.tx import Returned, Tx
from . import _journal, _queue_index
from ._context import PlaneContext


@attrs.frozen
class QueuedRequest:
    """A request still in the queue, leaving it without a lease."""

    request_id: str


@attrs.frozen
class NewLease:
    """The lease admission is about to create for a queued request."""

    lease_id: str
    request_id: str
    generation: int
    owner_instance_id: str


@attrs.frozen
class DrainCompletion:
    """The durable policy's soft drain ending, with the values the settled policy takes."""

    values: dict[str, Any]


Subject = QueuedRequest | NewLease | LeaseRow | DrainCompletion


def edge(event: EventKind, source: str, target: str) -> Transition:
    """The table's edge, or :class:`AdmissionStateError` if the table has none."""
    found = transition(event, source, target)
    if found is None or not found.written:
        raise AdmissionStateError("admission event transition is not allowlisted")
    return found


def change(
    ctx: PlaneContext,
    tx: Tx,
    subject: Subject,
    event: EventKind,
    target: str,
    now: int,
    *,
    source: str | None = None,
    locked: bool = False,
) -> bool:
    """Move ``subject`` along ``event`` to ``target``; ``False`` if a queued request had already left.

    ``source`` is the request's current state when it differs from the lease's phase (a
    live turn's ``provider_terminal`` step). Raises :class:`LeaseFenceError` when the
    lease no longer matches its fence, :class:`AdmissionStateError` for an edge the table
    does not have or a request that diverged from its lease.

    ``locked``: the unit read ``subject`` (a lease) row-locked and checked it against its fence
    and phase, so its move cannot miss. On PostgreSQL with the session functions a plain phase
    move is then sent with the unit's commit and checked on the server (``sent_edge``): a round
    trip fewer, and the same errors, raised by the commit instead of here.
    """
    if isinstance(subject, QueuedRequest):
        return _leave_queue(ctx, tx, subject, edge(event, RequestState.QUEUED, target), now)
    if isinstance(subject, NewLease):
        _create_lease(ctx, tx, subject, edge(event, RequestState.QUEUED, target), now)
        return True
    if isinstance(subject, DrainCompletion):
        _complete_drain(ctx, tx, subject, edge(event, DrainState.SOFT_DRAINING_TO_1.journal_token, target), now)
        return True
    moved = edge(event, subject.phase if source is None else source, target)
    _move_lease(ctx, tx, subject, moved, now, locked=locked)
    return True


def free_lease(
    ctx: PlaneContext, tx: Tx, lease: LeaseRow, event: EventKind, target: str, now: int, source: str | None = None
) -> str | None:
    """:func:`change` for an edge that deletes ``lease``; the policy's drain state if the same
    statement read it (PostgreSQL; ``''``: no durable policy), else ``None``."""
    moved = edge(event, lease.phase if source is None else source, target)
    if moved.lease is not LeaseEffect.DELETE:
        raise AdmissionStateError("the edge does not free the lease's seat")
    return _move_lease(ctx, tx, lease, moved, now)


def _leave_queue(ctx: PlaneContext, tx: Tx, subject: QueuedRequest, move: Transition, now: int) -> bool:
    params = {"request_id": subject.request_id, "source": move.source, "target": move.target, "now": now}
    if tx.execute(END_QUEUED_REQUEST, params) != 1:
        return False
    _queue_index.remove(tx, subject.request_id)
    _finish(ctx, tx, subject.request_id, move, now)
    return True


def _create_lease(ctx: PlaneContext, tx: Tx, lease: NewLease, move: Transition, now: int) -> None:
    params = {
        "lease_id": lease.lease_id,
        "request_id": lease.request_id,
        "generation": lease.generation,
        "owner_instance_id": lease.owner_instance_id,
        "source": move.source,
        "target": move.target,
        "now": now,
    }
    if tx.execute(RESERVE_REQUEST, params) != 1:
        raise AdmissionStateError("selected admission request is no longer queued")
    tx.execute(INSERT_LEASE, params)
    _queue_index.remove(tx, lease.request_id)
    _finish(ctx, tx, lease.request_id, move, now)


def _admission(
    lease_id: str, request_id: str, owner_instance_id: str, event: EventKind, now: int
) -> tuple[Transition, dict[str, object]]:
    """The ``queued -> admitted`` edge and the parameters of its one-statement reservation."""
    move = edge(event, RequestState.QUEUED, RequestState.ADMITTED)
    params: dict[str, object] = {
        "lease_id": lease_id,
        "request_id": request_id,
        "owner_instance_id": owner_instance_id,
        "source": move.source,
        "target": move.target,
        "now": now,
    }
    return move, params


def admit_at_once(
    ctx: PlaneContext, tx: Tx, lease_id: str, request_id: str, owner_instance_id: str, event: EventKind, now: int
) -> int | None:
    """PostgreSQL with the session functions: :func:`change` of a :class:`NewLease` to ``admitted``, with the
    generation taken from the request in the same statement (``ADMIT_REQUEST``, one round trip for what is
    four statements otherwise). The new lease's generation, or ``None`` if the request is no longer queued."""
    move, params = _admission(lease_id, request_id, owner_instance_id, event, now)
    row = tx.row(ADMIT_REQUEST, params)
    if row is None:
        return None
    generation, leases = row[0], row[1]
    if leases != 1:
        raise AdmissionStateError("admitted request has no lease")
    _finish(ctx, tx, request_id, move, now)
    return int(generation)


def admit_sent(
    ctx: PlaneContext,
    tx: Tx,
    lease_id: str,
    request_id: str,
    owner_instance_id: str,
    event: EventKind,
    now: int,
    *,
    blind: Mapping[str, object] | None = None,
    entering: EntryRow | None = None,
) -> Returned:
    """PostgreSQL with the session functions: :func:`admit_at_once` sent with the unit's commit (``SENT_ADMIT``),
    one round trip fewer inside the admission's lock. The new lease's generation is read after the commit
    (its :class:`~admission_plane.store.tx.Returned` row); a request no longer queued refuses the commit on the
    server (:class:`~admission_plane.store.unit_of_work.SentUnitRefused`), and nothing is committed.

    With ``blind`` (the parameters of ``SENT_BLIND_ADMIT``: what the caller assumed of the policy) the unit has
    read nothing: the server also decides whether the rule admits the request now, and refuses the commit if not.
    With ``entering`` too (an enqueue trying its new request's admission: the request's place, not yet in the
    admission index) it does not refuse (the unit commits its other writes either way): the row's generation is
    then ``None`` when the request was not admitted, the request entered the index, and nothing of the admission
    was written but its ring; an admitted request never enters the index (``SENT_BLIND_TRY``).
    """
    move, params = _admission(lease_id, request_id, owner_instance_id, event, now)
    if blind is None:
        returned = tx.send_returning(SENT_ADMIT, params)
    elif entering is None:
        returned = tx.send_returning(SENT_BLIND_ADMIT, {**params, **blind})
    else:
        place = _queue_index.add_params(request_id, entering)
        returned = tx.send_returning(SENT_BLIND_TRY, {**params, **blind, **place})
    _finish(ctx, tx, request_id, move, now, if_lease=None if entering is None else lease_id)
    return returned


def move_unread(
    ctx: PlaneContext, tx: Tx, fence: Mapping[str, object], event: EventKind, source: str, target: str, now: int
) -> bool:
    """PostgreSQL: :func:`change` of the lease ``fence`` names from phase ``source``, without reading the lease
    first (``unread_move``: one round trip less). ``False`` when the fence or the phase did not match, and
    nothing changed: the caller then reads the lease for the refusal. :class:`AdmissionStateError` when the
    lease moved but its request was not in ``source``."""
    move = edge(event, source, target)
    if move.lease is not LeaseEffect.MOVE:
        raise AdmissionStateError("the edge does not move the lease")
    payload = move.target in PAYLOAD_DELETED_STATES
    params = {**fence, "phase": source, "source": source, "target": move.target, "now": now}
    row = tx.row(unread_move(move.target in TERMINAL_STATES, payload), params)
    if row is None or row[0] != 1:
        return False
    if row[1] != 1:
        raise AdmissionStateError(f"lease and request state diverged at {move.target}")
    _finish(ctx, tx, row[-1], move, now, payload_deleted=payload)
    return True


def move_sent(
    ctx: PlaneContext,
    tx: Tx,
    fence: Mapping[str, object],
    request_id: str,
    event: EventKind,
    source: str,
    target: str,
    now: int,
    *,
    limit: int | None = None,
    revision: int = 0,
    dispatch: bool = False,
) -> None:
    """PostgreSQL with the session functions: :func:`change` of the lease ``fence`` names, from phase ``source``,
    for a unit that reads nothing first: the move travels with the unit's commit and the server checks it
    (``sent_move``), with what else the unit assumed: for a start (``limit`` given), the start window within
    ``limit`` and the durable policy at ``revision``; for a dispatch intent (``dispatch``), no evidence.
    ``request_id`` is the lease's request as admission issued it (:class:`~admission_plane.values.AdmittedLease`);
    the server refuses the move unless the lease names it.
    A refusal raises :class:`~admission_plane.store.unit_of_work.SentUnitRefused` from the commit, and
    nothing is committed (see :meth:`~admission_plane.service._context.PlaneContext.run_sent`)."""
    move = edge(event, source, target)
    if move.lease is not LeaseEffect.MOVE or move.target in TERMINAL_STATES:
        raise AdmissionStateError("the edge does not move the lease to a live phase")
    params = {**fence, "request_id": request_id, "source": source, "target": move.target, "now": now}
    if limit is not None:
        params.update(limit=limit, revision=revision)
    tx.send(sent_move(starting=limit is not None, dispatch=dispatch), params)
    _finish(ctx, tx, request_id, move, now)


def end_sent(
    ctx: PlaneContext,
    tx: Tx,
    fence: Mapping[str, Any],
    request_id: str,
    moves: tuple[Transition, Transition],
    now: int,
) -> None:
    """PostgreSQL with the session functions: :func:`end_unread`'s two edges for a unit that reads nothing
    first: they travel with the unit's commit, checked on the server (``sent_release``), which also refuses
    the unit when freeing the seat needs more (a budget reservation to settle, a soft drain pending).
    ``request_id``: as in :func:`move_sent`. A refusal raises
    :class:`~admission_plane.store.unit_of_work.SentUnitRefused` from the commit, and nothing is committed."""
    first, last = moves
    if first.lease is not LeaseEffect.KEEP or last.lease is not LeaseEffect.DELETE or first.target != last.source:
        raise AdmissionStateError("the edges do not end the lease through one kept step")
    params = {**fence, "request_id": request_id, "phase": first.source, "source": first.source, "now": now}
    tx.send(sent_release(), {**params, "target": last.target})
    for move in moves:
        _finish(ctx, tx, request_id, move, now)


def end_unread(
    ctx: PlaneContext, tx: Tx, fence: Mapping[str, Any], moves: tuple[Transition, Transition], now: int
) -> tuple[LeaseRow, str] | None:
    """PostgreSQL: two edges of a lease ``fence`` names, applied as one statement without reading the lease
    first (``unread_release``): ``moves[0]`` keeps the lease and moves only its request (a live turn's
    ``provider_terminal``), ``moves[1]`` deletes the lease and ends the request. Both are journalled. The
    lease as it was and the policy's drain state (``''``: none); ``None`` when the fence or the phase did
    not match and nothing changed (the caller then reads the lease for the refusal)."""
    first, last = moves
    if first.lease is not LeaseEffect.KEEP or last.lease is not LeaseEffect.DELETE or first.target != last.source:
        raise AdmissionStateError("the edges do not end the lease through one kept step")
    payload = first.target in PAYLOAD_DELETED_STATES or last.target in PAYLOAD_DELETED_STATES
    params = {**fence, "phase": first.source, "source": first.source, "target": last.target, "now": now}
    row = tx.row(unread_release(payload), params)
    if row is None or row[0] != 1:
        return None
    if row[1] != 1:
        raise AdmissionStateError(f"lease and request state diverged at {last.target}")
    drain_state, request_id, charged = row[-3:]
    for move in moves:
        _finish(ctx, tx, request_id, move, now, payload_deleted=payload)
    lease = LeaseRow(
        lease_id=fence["lease_id"],
        request_id=request_id,
        generation=fence["generation"],
        owner_instance_id=fence["owner_instance_id"],
        phase=first.source,
        charged=bool(charged),
    )
    return lease, drain_state


def _move_lease(
    ctx: PlaneContext, tx: Tx, lease: LeaseRow, move: Transition, now: int, *, locked: bool = False
) -> str | None:
    """Apply a lease edge; on PostgreSQL, when it deletes the lease, return the policy's drain state
    read by the same statement (``''``: no durable policy; ``None``: not read). ``locked``: see :func:`change`."""
    fence = {
        "lease_id": lease.lease_id,
        "owner_instance_id": lease.owner_instance_id,
        "generation": lease.generation,
        "phase": lease.phase,
        "now": now,
    }
    terminal = move.target in TERMINAL_STATES
    params = {"request_id": lease.request_id, "generation": lease.generation, "now": now}
    sendable = move.lease is LeaseEffect.MOVE and move.target not in PAYLOAD_DELETED_STATES
    if locked and sendable and tx.functions and lease.phase == move.source:
        # Checked on the server, with the commit (store.statements.transitions.sent_edge).
        tx.send(sent_edge(terminal), {**fence, **params, "source": lease.phase, "target": move.target})
        _finish(ctx, tx, lease.request_id, move, now)
        return None
    if tx.dialect.name == "postgresql" and move.lease in _COMBINED:
        # One round trip for the lease, the request and the payload (store.statements.transitions).
        payload = move.target in PAYLOAD_DELETED_STATES
        source = lease.phase if move.lease is LeaseEffect.MOVE else move.source
        row = tx.row(
            combined_edge(move.lease, terminal, payload),
            {**fence, **params, "source": source, "target": move.target},
        )
        if row is None or row[0] != 1:
            raise LeaseFenceError()
        if row[1] != 1:
            raise AdmissionStateError(f"lease and request state diverged at {move.target}")
        _finish(ctx, tx, lease.request_id, move, now, payload_deleted=payload)
        return row[-1] if move.lease is LeaseEffect.DELETE else None
    if move.lease is LeaseEffect.MOVE:
        changed = tx.execute(SET_LEASE_PHASE, {**fence, "source": lease.phase, "target": move.target})
    elif move.lease is LeaseEffect.DELETE:
        changed = tx.execute(DELETE_LEASE, fence)
    else:
        changed = 1
    if changed != 1:
        raise LeaseFenceError()
    request = END_LEASED_REQUEST if terminal else SET_REQUEST_STATE
    if tx.execute(request, {**params, "source": move.source, "target": move.target}) != 1:
        raise AdmissionStateError(f"lease and request state diverged at {move.target}")
    _finish(ctx, tx, lease.request_id, move, now)
    return None


def _complete_drain(ctx: PlaneContext, tx: Tx, drain: DrainCompletion, move: Transition, now: int) -> None:
    tx.ring(Bell.EVERYONE)
    if tx.execute(COMPLETE_DRAIN, drain.values) != 1:
        raise AdmissionRuntimeError("soft drain could not be completed atomically")
    _journal.record(ctx, tx, move.event, POLICY_EVENT_ID, move.source, move.target, now)


def _finish(
    ctx: PlaneContext,
    tx: Tx,
    request_id: str,
    move: Transition,
    now: int,
    *,
    payload_deleted: bool = False,
    if_lease: str | None = None,
) -> None:
    """What every request edge ends with: the payload rule, the doorbell and the journal (``if_lease``: an
    admission the server may not make, journalled only if its lease exists; its ring is then a spare look)."""
    if move.target in PAYLOAD_DELETED_STATES and not payload_deleted:
        tx.send(DELETE_PAYLOAD, {"request_id": request_id})
    tx.ring(_bells(move))
    _journal.record(ctx, tx, move.event, request_id, move.source, move.target, now, if_lease=if_lease)


def _bells(move: Transition) -> int:
    """What waiting connectors hear: a departure from the queue, a freed seat, a freed start slot.

    A freed seat rings the start-slot counter too: a waiter held back by the start window
    looks again whenever the lease count drops.
    """
    bells = _QUEUE if move.source == RequestState.QUEUED else 0
    if move.frees_seat:
        bells |= _SEATS | _STARTS
    elif move.frees_start_slot:
        bells |= _STARTS
    return bells


_COMBINED = frozenset({LeaseEffect.MOVE, LeaseEffect.DELETE})
# Plain integers: every transaction computes its bells, and IntFlag arithmetic costs enum calls.
_QUEUE, _SEATS, _STARTS = int(Bell.QUEUE), int(Bell.SEATS), int(Bell.STARTS)
