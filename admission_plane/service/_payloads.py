"""Sealed prompts: stored with the request, read back once for the dispatch write, deleted on expiry."""

from __future__ import annotations

import uuid

import attrs

from .. import _validate as v
from ..crypto import InvalidTag, SealedPayload, content_fingerprint, open_sealed, seal
from ..errors import (
    AdmissionStateError,
    InvalidInputError,
    PayloadConflictError,
    PayloadExpiredError,
    PayloadIntegrityError,
)
from ..evidence import ConnectorIdentity
from ..states import EventKind
from ..store.doorbell import Doorbell
from ..store.rows import EntryRow, PayloadRow
from ..store.statements.requests import (
    INSERT_PAYLOAD,
    SELECT_ENTRY_OF_REQUEST,
    SELECT_PAYLOAD,
    SELECT_PAYLOAD_FINGERPRINT,
)
from ..store.statements.transitions import DELETE_PAYLOAD
from ..store.tx import Tx
from ..store.unit_of_work import Gate
from ..values import EnqueueResult
from . import _queue_index
from ._admission import SentLease, Verdict, admit_in_transaction, blind_applies
from ._context import PlaneContext, WaitHint
from ._enqueue import ENQUEUE_GATE, Metadata, bind_owner, insert_request, require_queued, send_request
from ._transitions import admit_sent
from ._wake import Wake


def check_expiry(now: int, expires_at: int) -> None:
    """A payload must expire after it is stored."""
    if not v.is_safe_integer(now) or not v.is_safe_integer(expires_at) or expires_at <= now:
        raise InvalidInputError("payload expiry must be after persistence time")


def enqueue_with_payload(
    ctx: PlaneContext,
    meta: Metadata,
    connector: ConnectorIdentity,
    now: int,
    plaintext: str,
    expires_at: int,
    admit_as: str | None = None,
) -> EnqueueResult:
    """Queue a request and its sealed prompt atomically (idempotent for the same prompt).

    With ``admit_as`` (an owner instance ID), a new request is also admitted in the same transaction when the rule
    admits it now, as a waiter's first attempt would (:func:`~admission_plane.service._admission.admit_request`
    with ``parallel``): one commit instead of two. SQLite admits it the long way inside the enqueue's write lock;
    PostgreSQL, where the enqueue is sent whole, sends the admission with it under the admission gate and the
    server decides it (``SENT_BLIND_TRY``: the enqueue commits whether or not it admits), under a policy the server
    decides (:func:`~admission_plane.service._admission.blind_applies`); otherwise it only enqueues.
    """
    fingerprint_hex, sealed = _seal(ctx, meta.request_id, plaintext)
    postgres = ctx.engine.dialect.name == "postgresql"
    blind = None if admit_as is None or not postgres else blind_applies(ctx, admit_as, True)
    admit_long = admit_as if not postgres or blind is not None else None  # under a gate that admits
    # SQLite: the doorbell is read under the writer gate, so a refused admission can hand its look to the wait.
    bell = ctx.doorbell if isinstance(ctx.doorbell, Doorbell) else None
    hints: list[WaitHint] = []

    def work(tx: Tx) -> EnqueueResult:
        hints.clear()
        result, lane = insert_request(ctx, tx, meta, connector, now)
        if not result.existed:
            # Created by this transaction: queued, bound to ``connector`` by its insert, without a payload.
            bind_owner(ctx, tx, meta.request_id, connector, now, False, created=True)
            entry = EntryRow(lane, meta.provider, meta.model, meta.agent_id, meta.session_id, now)
            _insert(tx, meta.request_id, sealed, fingerprint_hex, expires_at, now, entry)
            if admit_long is None:
                return result
            refused: list[Wake | Verdict | None] | None = [] if bell is not None else None
            admitted = admit_in_transaction(ctx, tx, now, admit_long, meta.request_id, parallel=True, refused=refused)
            assert not isinstance(admitted, SentLease), "sent=False"
            wake = refused[0] if refused else None
            if bell is not None and isinstance(wake, Wake) and (seen := bell.read()) is not None:
                hints.append(WaitHint(meta.request_id, admit_long, seen, wake))
            return attrs.evolve(result, admitted=admitted)
        status = require_queued(tx, meta.request_id)
        bind_owner(ctx, tx, meta.request_id, connector, now, True, status)
        if _stored_already(tx, meta.request_id, fingerprint_hex):
            return EnqueueResult(meta.request_id, True)
        _insert(tx, meta.request_id, sealed, fingerprint_hex, expires_at, now)
        return result

    def sent(tx: Tx) -> EnqueueResult | _Tried:
        lane = send_request(ctx, tx, meta, connector, now)  # PostgreSQL: everything with the commit
        if lane is None:
            return work(tx)
        entry = EntryRow(lane, meta.provider, meta.model, meta.agent_id, meta.session_id, now)
        if blind is None or admit_as is None:
            _insert(tx, meta.request_id, sealed, fingerprint_hex, expires_at, now, entry)
            return EnqueueResult(meta.request_id, False)
        # Tried: the admission's statement puts the request in the admission index only if it does not admit it.
        _insert(tx, meta.request_id, sealed, fingerprint_hex, expires_at, now, entry, indexed=False)
        lease_id = str(uuid.uuid4())
        returned = admit_sent(
            ctx, tx, lease_id, meta.request_id, admit_as, EventKind.REQUEST_ADMITTED, now, blind=blind, entering=entry
        )
        return _Tried(EnqueueResult(meta.request_id, False), SentLease(lease_id, meta.request_id, admit_as, returned))

    result = ctx.run_sent(sent, work, gate=ENQUEUE_GATE if admit_long is None else Gate.ADMISSION)
    if isinstance(result, _Tried):
        result = attrs.evolve(result.enqueued, admitted=result.lease.lease_if_admitted())
    if admit_long is not None:  # tried: whether the connector's next wait should try at once (``queue_busy``)
        ctx.queue_busy = result.admitted is None
        ctx.wait_hint = hints[0] if hints and result.admitted is None else None
    return result


@attrs.frozen
class _Tried:
    """An enqueue sent whole with its request's admission: the enqueue, and the lease if the server admitted it."""

    enqueued: EnqueueResult
    lease: SentLease


def persist(ctx: PlaneContext, request_id: str, plaintext: str, now: int, expires_at: int) -> None:
    """Attach a sealed prompt to a queued request (idempotent for the same prompt)."""
    check_expiry(now, expires_at)
    v.identifier(request_id, "payload request ID")
    v.timestamp(now, "payload persistence timestamp")  # enqueue_with_payload checks it as the request's timestamp
    fingerprint_hex, sealed = _seal(ctx, request_id, plaintext)

    def work(tx: Tx) -> None:
        require_queued(tx, request_id)
        if not _stored_already(tx, request_id, fingerprint_hex):
            _insert(tx, request_id, sealed, fingerprint_hex, expires_at, now)

    ctx.run(work)


def read(ctx: PlaneContext, request_id: str, now: int) -> str:
    """Decrypt a request's prompt; at or after its expiry, delete it and raise :class:`PayloadExpiredError`."""
    v.identifier(request_id, "payload request ID")
    v.timestamp(now, "payload read timestamp")
    key = ctx.keys.require_encryption()

    def select(tx: Tx) -> PayloadRow:
        row = tx.one(SELECT_PAYLOAD, {"request_id": request_id})
        if row is None:
            raise AdmissionStateError("no payload is available")
        return row

    def delete_expired(tx: Tx) -> None:
        if select(tx).expires_at <= now:
            tx.execute(DELETE_PAYLOAD, {"request_id": request_id})
            _queue_index.remove(tx, request_id)  # a queued request without its payload is not admissible

    # Read without the write lock; only an expired payload needs a writing transaction.
    row = ctx.run(select, read_only=True)
    if row.expires_at <= now:
        ctx.run(delete_expired)
        raise PayloadExpiredError()
    sealed = SealedPayload(bytes(row.nonce), bytes(row.ciphertext), bytes(row.auth_tag), row.key_version)
    try:
        return open_sealed(key, request_id, sealed)
    except (InvalidTag, ValueError):
        raise PayloadIntegrityError() from None


def _seal(ctx: PlaneContext, request_id: str, plaintext: str) -> tuple[str, SealedPayload]:
    v.plaintext(plaintext)
    fingerprint_hex = content_fingerprint(ctx.keys.require_content(), request_id, plaintext)
    return fingerprint_hex, seal(ctx.keys.require_encryption(), request_id, plaintext)


def _stored_already(tx: Tx, request_id: str, fingerprint_hex: str) -> bool:
    """Whether the request holds this very prompt; :class:`PayloadConflictError` if it holds another."""
    existing = tx.scalar(SELECT_PAYLOAD_FINGERPRINT, {"request_id": request_id})
    if existing is None:
        return False
    if existing != fingerprint_hex:
        raise PayloadConflictError()
    return True


def _insert(
    tx: Tx,
    request_id: str,
    sealed: SealedPayload,
    fingerprint_hex: str,
    expires_at: int,
    now: int,
    entry: EntryRow | None = None,
    *,
    indexed: bool = True,
) -> None:
    """Store the sealed prompt of a queued request, which makes it admissible (it enters the admission index;
    ``entry``: its place, when the caller knows it; without ``indexed`` the caller puts it there in the same
    transaction, ``SENT_BLIND_TRY``). Nothing here reads the row back: on PostgreSQL it travels with the commit
    (``Tx.send``)."""
    tx.send(
        INSERT_PAYLOAD,
        {
            "request_id": request_id,
            "nonce": sealed.nonce,
            "ciphertext": sealed.ciphertext,
            "auth_tag": sealed.auth_tag,
            "key_version": sealed.key_version,
            "content_fingerprint": fingerprint_hex,
            "expires_at": expires_at,
            "now": now,
        },
    )
    # Its place in the admission index (the request is queued: the caller checked it).
    if not indexed:
        return
    if entry is None:
        entry = tx.one(SELECT_ENTRY_OF_REQUEST, {"request_id": request_id})
    if entry is not None:
        _queue_index.add(tx, request_id, entry)
