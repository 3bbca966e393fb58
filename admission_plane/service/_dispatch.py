"""The dispatch intent: process evidence and ``starting -> dispatch_intent`` in one transaction.

This is the last step before the irreversible prompt write, so it never raises for
contention or driver faults: it reports ``committed``/``not_committed`` with a reason.
A writer that lost the lock only inspects the committed winner; it never retries the
write (a retry could record a second intent for one dispatch).
"""

from __future__ import annotations

import time

from ..errors import InvalidInputError, LeaseFenceError
from ..states import EventKind, RequestState
from ..store.rows import IdentityRow, LeaseRow, as_params
from ..store.statements.dispatch import (
    INSERT_IDENTITY,
    SELECT_IDENTITY,
    SELECT_LEASE_FOR_DISPATCH,
    SELECT_LEASE_WITH_REQUEST,
)
from ..store.tx import Tx
from ..store.unit_of_work import Gate, contention_name
from ..values import DispatchIntentResult, DispatchRecord, LeaseFence
from ._context import PlaneContext
from ._inventory import dispatch_record_from_mapping
from ._lifecycle import fence_params
from ._transitions import change, move_sent

S = RequestState
MAX_CONTENTION_RECHECKS = 500
CONTENTION_RECHECK_DELAY_S = 0.002
_PENDING = "pending"


def persist(ctx: PlaneContext, record: DispatchRecord | object) -> DispatchIntentResult:
    """Record ``record``'s evidence with the dispatch intent; ``committed`` or ``not_committed``."""
    normalized = _normalize(record)
    if normalized is None:
        return _not_committed("invalid_process_identity")
    driver_error = ctx.engine.dialect.loaded_dbapi.Error
    try:
        # A lease unit (see ``_lifecycle``): the lease row is locked first, so the phase and the
        # evidence it reads are final; nothing here is read by admission (``Tx.count_neutral``).
        # PostgreSQL with the session functions: sent whole with its commit first (``_sent``).
        sent, long = (lambda tx: _sent(ctx, tx, normalized)), (lambda tx: _in_transaction(ctx, tx, normalized))
        return ctx.run_sent(sent, long, gate=Gate.LEASE)
    except Exception as error:  # noqa: BLE001 - a prompt writer must never see a raw or partial failure
        cause = error.__cause__ if isinstance(error.__cause__, driver_error) else error
        if contention_name(cause) is not None:
            winner = _recheck_after_contention(ctx, normalized)
            if winner is not None:
                return winner
        return _not_committed("transaction_fault")


def as_recorded(result: DispatchIntentResult) -> DispatchIntentResult:
    """The same outcome in :meth:`~admission_plane.AdmissionPlane.record_process_identity`'s words."""
    if result.reason is None:
        return DispatchIntentResult("recorded", idempotent=result.idempotent)
    return DispatchIntentResult("not_recorded", reason=result.reason)


def identity_row(record: DispatchRecord) -> IdentityRow:
    """The identity row ``record`` is stored as."""
    connector, child = record.connector.process, record.child
    return IdentityRow(
        record.request_id, record.generation, record.owner_instance_id, str(record.prompt_channel),
        record.connector.owner_instance_id, record.connector.created_at, connector.boot_id, connector.pid,
        connector.start_time_ticks, connector.pid_namespace_inode, connector.ppid, connector.pgrp, connector.session,
        child.boot_id, child.pid, child.start_time_ticks, child.pid_namespace_inode, child.ppid, child.pgrp,
        child.session,
    )  # fmt: skip


def _in_transaction(ctx: PlaneContext, tx: Tx, record: DispatchRecord) -> DispatchIntentResult:
    row = tx.row(SELECT_LEASE_FOR_DISPATCH, {"lease_id": record.lease_id})
    if row is None:
        return _not_committed("stale_lease")
    lease, identified = LeaseRow.from_row(row[:-1]), bool(row[-1])
    if (lease.request_id, lease.generation, lease.owner_instance_id) != (
        record.request_id,
        record.generation,
        record.owner_instance_id,
    ):
        return _not_committed("stale_lease")
    if lease.phase == S.DISPATCH_INTENT:  # a replay: its evidence, read after the lease's lock
        existing = tx.one(SELECT_IDENTITY, {"lease_id": record.lease_id})
        if existing is not None and existing == identity_row(record):
            return DispatchIntentResult("committed", idempotent=True)
        return _not_committed("conflicting_intent")
    if lease.phase != S.STARTING:
        return _not_committed("stale_lease")
    if identified:  # evidence without an intent: see ``SELECT_LEASE_FOR_DISPATCH``
        return _not_committed("conflicting_intent")
    committed_at = ctx.now()
    try:
        # The lease was read locked and checked against the record's fence and phase above.
        change(ctx, tx, lease, EventKind.REQUEST_DISPATCH_INTENT, S.DISPATCH_INTENT, committed_at, locked=True)
    except LeaseFenceError:
        return _not_committed("stale_lease")
    return _record_identity(ctx, tx, record, committed_at)


def _sent(ctx: PlaneContext, tx: Tx, record: DispatchRecord) -> DispatchIntentResult:
    """The dispatch intent read nothing first: its move and evidence travel with the commit, and the server
    checks what ``_in_transaction`` would have read (``move_sent`` with ``dispatch``: the lease in ``starting``
    under the record's fence and request, and no evidence recorded for it). Anything else (a replay, a stale
    lease, stray evidence) refuses the unit, and ``_in_transaction`` answers it, reading first."""
    committed_at = ctx.now()
    fence = fence_params(LeaseFence(record.lease_id, record.generation, record.owner_instance_id))
    move_sent(
        ctx, tx, fence, record.request_id, EventKind.REQUEST_DISPATCH_INTENT, S.STARTING, S.DISPATCH_INTENT,
        committed_at, dispatch=True,
    )  # fmt: skip
    return _record_identity(ctx, tx, record, committed_at)


def _record_identity(ctx: PlaneContext, tx: Tx, record: DispatchRecord, committed_at: int) -> DispatchIntentResult:
    """After the move to ``dispatch_intent``: the process evidence, in the same transaction."""
    values = as_params(identity_row(record))
    tx.count_neutral = True  # starting -> dispatch_intent: the lease stays in the start window
    tx.send(INSERT_IDENTITY, {"lease_id": record.lease_id, "now": committed_at, "host_id": ctx.host_id, **values})
    hook = ctx.faults.after_process_identity_persisted
    if hook is not None:
        tx.flush()  # the hook runs with the move and the evidence written, the lease's row lock held
        hook()
    return DispatchIntentResult("committed", idempotent=False)


def _recheck_after_contention(ctx: PlaneContext, record: DispatchRecord) -> DispatchIntentResult | None:
    for attempt in range(MAX_CONTENTION_RECHECKS):
        try:
            outcome = ctx.run(lambda tx: _inspect_winner(tx, record), read_only=True)
        except Exception as error:  # noqa: BLE001 - only contention keeps the recheck going
            if contention_name(error.__cause__ or error) is None:
                return None
            outcome = _PENDING
        if outcome != _PENDING:
            return outcome if isinstance(outcome, DispatchIntentResult) else None
        if attempt < MAX_CONTENTION_RECHECKS - 1:
            time.sleep(CONTENTION_RECHECK_DELAY_S)
    return None


def _inspect_winner(tx: Tx, record: DispatchRecord) -> DispatchIntentResult | str | None:
    """The committed outcome for exactly ``record``'s lease, ``"pending"`` while undecided, else ``None``."""
    lease = tx.one(SELECT_LEASE_WITH_REQUEST, {"lease_id": record.lease_id})
    if lease is None or (
        lease.request_id,
        lease.generation,
        lease.owner_instance_id,
        lease.request_generation,
    ) != (record.request_id, record.generation, record.owner_instance_id, record.generation):
        return None
    identity = tx.one(SELECT_IDENTITY, {"lease_id": record.lease_id})
    if lease.phase == S.DISPATCH_INTENT and lease.request_state == S.DISPATCH_INTENT:
        if identity is None or (identity.request_id, identity.lease_generation, identity.owner_instance_id) != (
            record.request_id,
            record.generation,
            record.owner_instance_id,
        ):
            return None
        if identity == identity_row(record):
            return DispatchIntentResult("committed", idempotent=True)
        return _not_committed("conflicting_intent")
    if lease.phase == S.STARTING and lease.request_state == S.STARTING and identity is None:
        return _PENDING
    return None


def _normalize(record: object) -> DispatchRecord | None:
    """A :class:`DispatchRecord`, or the original's camelCase mapping of one; ``None`` if invalid."""
    if isinstance(record, DispatchRecord):
        return record
    try:
        return dispatch_record_from_mapping(record)
    except (InvalidInputError, TypeError, ValueError, KeyError):
        return None


def _not_committed(reason: str) -> DispatchIntentResult:
    return DispatchIntentResult("not_committed", reason=reason)
