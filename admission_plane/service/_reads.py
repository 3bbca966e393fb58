"""Reads: one request, a queued request's place, and the recovery inventory (never a payload)."""

from __future__ import annotations

from .. import _validate as v
from ..states import RequestState
from ..store.statements.admission import COOLDOWN_UNTIL, COUNT_AHEAD, COUNT_ELIGIBLE_AHEAD, SELECT_QUEUED_ENTRY
from ..store.statements.dispatch import LIST_DISPATCHES
from ..store.statements.requests import LIST_LEASE_HOLDERS, LIST_QUEUED_OWNERS, SELECT_REQUEST
from ..store.tx import Tx
from ..values import QueueSnapshot, RecoverableDispatch, RecoverableQueuedOwner, RecoveryInventory, StoredRequest
from ._admission import expire_queued
from ._context import PlaneContext
from ._inventory import dispatch_from_row, queued_owner_from_row, triage


def get_request(ctx: PlaneContext, request_id: str) -> StoredRequest | None:
    """A request's metadata and state, or ``None``."""
    v.identifier(request_id, "request ID")
    row = ctx.run(lambda tx: tx.one(SELECT_REQUEST, {"request_id": request_id}), read_only=True)
    if row is None:
        return None
    return StoredRequest(
        request_id=row.request_id,
        session_id=row.session_id,
        agent_id=row.agent_id,
        fingerprint=row.fingerprint,
        provider=row.provider,
        model=row.model,
        state=RequestState(row.state),
        enqueued_at=row.enqueued_at,
    )


def queue_snapshot(ctx: PlaneContext, request_id: str, now: int) -> QueueSnapshot | None:
    """Where a queued request stands; ``None`` if it is unknown, not queued or has no payload."""
    v.identifier(request_id, "queue snapshot request ID")
    v.timestamp(now, "queue snapshot timestamp")

    def work(tx: Tx) -> QueueSnapshot | None:
        expire_queued(ctx, tx, now)
        entry = tx.one(SELECT_QUEUED_ENTRY, {"request_id": request_id})
        if entry is None:
            return None
        cooldown_until = tx.scalar(COOLDOWN_UNTIL, {"provider": entry.provider, "model": entry.model, "now": now})
        ahead = {"enqueued_at": entry.enqueued_at, "request_id": request_id, "now": now}
        position = tx.scalar(COUNT_AHEAD, ahead) or 0
        eligible = None if cooldown_until is not None else tx.scalar(COUNT_ELIGIBLE_AHEAD, ahead)
        return QueueSnapshot(
            request_id=request_id,
            position=position,
            eligible_position=eligible,
            enqueued_at=entry.enqueued_at,
            waited_ms=max(0, now - entry.enqueued_at),
            cooldown_until=cooldown_until,
        )

    return ctx.run(work)


def recoverable_dispatches(ctx: PlaneContext) -> tuple[RecoverableDispatch, ...]:
    """Every seat-holding lease with its process evidence (or ``None``)."""
    rows = ctx.run(lambda tx: tx.all(LIST_DISPATCHES), read_only=True)
    return tuple(dispatch_from_row(row) for row in rows)


def recoverable_queued_owners(ctx: PlaneContext) -> tuple[RecoverableQueuedOwner, ...]:
    """Queued requests with the connector identity that enqueued them."""
    rows = ctx.run(lambda tx: tx.all(LIST_QUEUED_OWNERS), read_only=True)
    return tuple(queued_owner_from_row(row) for row in rows)


def recovery_inventory(ctx: PlaneContext) -> RecoveryInventory:
    """Queued owners, leases and the holders of leases before their dispatch intent, each row judged alone."""

    def work(tx: Tx) -> RecoveryInventory:
        return triage(tx.all(LIST_QUEUED_OWNERS), tx.all(LIST_DISPATCHES), tx.all(LIST_LEASE_HOLDERS))

    return ctx.run(work, read_only=True)
