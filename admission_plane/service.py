"""``AdmissionPlane``: the public operations of the original AdmissionController.

Every operation is one unit of work (:func:`admission_plane.unit_of_work.run`): it reads
its state inside the transaction, checks its fence and expected phase there, and either
commits everything or changes nothing. Callers pass ``now`` (integer milliseconds); only
the dispatch-intent path and evidence capture read the real clock, as in the seed.
"""

from __future__ import annotations

import enum
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from . import _queries as q
from . import _validate as v
from ._doorbell import EVERYONE_STEP, Bell, Chimes, Doorbell, ListeningDoorbell, open_doorbell
from ._inventory import dispatch_from_row, dispatch_record_from_mapping, queued_owner_from_row
from ._sql import Tx
from .crypto import (
    EventCorrelator,
    InvalidTag,
    SealedPayload,
    SecretKey,
    content_fingerprint,
    open_sealed,
    policy_fingerprint,
    seal,
)
from .db import create_admission_engine
from .errors import (
    AdmissionConflictError,
    AdmissionRuntimeError,
    AdmissionStateError,
    InvalidInputError,
    LeaseFenceError,
    MissingKeyError,
    PayloadConflictError,
    PayloadExpiredError,
    PayloadIntegrityError,
    UnknownLeaseError,
    UnknownRequestError,
)
from .evidence import ConnectorIdentity
from .host import default_host_id
from .policy import Policy
from .states import (
    ABANDONABLE_PHASES,
    EVENT_STATES,
    EXECUTION_RECOVERY_PHASES,
    LEASE_TRANSITIONS,
    POLICY_EVENT_ID,
    POLICY_SOFT_DRAINING_TO_1,
    POLICY_STEADY,
    START_WINDOW_PHASES,
    DrainState,
    EventKind,
    FailureCategory,
    RequestState,
    SuspectReason,
    is_allowed_transition,
)
from .unit_of_work import contention_name, run
from .values import (
    AdmittedLease,
    DispatchIntentResult,
    DispatchRecord,
    EnqueueResult,
    LeaseFence,
    LiveTurnCompletion,
    QueueSnapshot,
    ReaperSummary,
    RecoverableDispatch,
    RecoverableQueuedOwner,
    SanitizedEvent,
    StoredRequest,
    abandon_outcome,
)

if TYPE_CHECKING:
    from .turn import Turn

S = RequestState
K = EventKind
MAX_DISPATCH_CONTENTION_RECHECKS = 500
BEHIND_DELAY_S = 0.003
#: With a doorbell, a waiter looks again at least this often (ms) even if nothing rang:
#: writers that do not ring (another program on the same file) are noticed this late.
DOORBELL_FALLBACK_MS = 250
DISPATCH_CONTENTION_RECHECK_DELAY_S = 0.002
_TERMINAL_LEASE_PHASES = frozenset({S.PROVIDER_TERMINAL, S.COMPLETED, S.FAILED, S.CANCELLED, S.QUEUE_TIMEOUT})


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000


@attrs.frozen
class FaultInjection:
    """Test hooks. ``after_process_identity_persisted`` runs inside the dispatch-intent
    transaction after the identity row is written; if it raises, the transaction rolls back
    and the call reports ``transaction_fault``."""

    after_process_identity_persisted: Callable[[], object] | None = None


class AdmissionPlane:
    """A durable, cross-process admission plane for agent turns.

    Open it on a database URL (``sqlite:///path`` or ``postgresql+psycopg://...``), a
    filesystem path (an SQLite file) or an :class:`~sqlalchemy.Engine`. The schema must be
    at Alembic head (``alembic upgrade head``) unless ``migrate=True``; the integrity check
    runs on open and refuses a drifted database with
    :class:`~admission_plane.errors.SchemaIntegrityError`.

    Keys are 32 bytes: ``encryption_key`` seals payloads, ``content_fingerprint_key``
    keys the content, policy and journal HMACs (journalled operations need it). The plane
    copies them and wipes its copies on :meth:`close`.

    Thread-safe: each operation checks out its own connection and transaction.
    """

    def __init__(
        self,
        database: str | os.PathLike[str] | URL | Engine,
        *,
        policy: Policy | None = None,
        encryption_key: bytes | None = None,
        content_fingerprint_key: bytes | None = None,
        owner_identity: ConnectorIdentity | None = None,
        fault_injection: FaultInjection | None = None,
        migrate: bool = False,
        clock: Callable[[], int] = wall_clock_ms,
        host_id: str | None = None,
    ) -> None:
        """See the class docstring; ``host_id`` names this host in recorded evidence
        (default: :func:`admission_plane.host.default_host_id`)."""
        self.policy = Policy() if policy is None else policy
        if not isinstance(self.policy, Policy):
            raise InvalidInputError("policy must be an admission_plane.Policy")
        self._encryption_key = None if encryption_key is None else SecretKey(encryption_key, "encryption")
        self._content_key = (
            None if content_fingerprint_key is None else SecretKey(content_fingerprint_key, "content fingerprint")
        )
        self._correlate = None if self._content_key is None else EventCorrelator(self._content_key)
        if fault_injection is not None and not isinstance(fault_injection, FaultInjection):
            raise InvalidInputError("fault injection must be a FaultInjection")
        self._faults = fault_injection or FaultInjection()
        self._clock = clock
        if owner_identity is None:
            owner_identity = ConnectorIdentity.capture()
        elif not isinstance(owner_identity, ConnectorIdentity):
            raise InvalidInputError("owner identity must be a ConnectorIdentity")
        self.owner_identity = owner_identity
        self.host_id = default_host_id() if host_id is None else v.identifier(host_id, "host ID")
        if isinstance(database, Engine):
            self.engine, self._owns_engine = database, False
        else:
            self.engine, self._owns_engine = create_admission_engine(database), True
        self._doorbell = open_doorbell(self.engine)
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            self._open_schema(migrate)
        except BaseException:
            self.close()
            raise

    def _open_schema(self, migrate: bool) -> None:
        from .schema_check import check_schema

        if migrate:
            from .migrate import upgrade

            upgrade(self.engine)
        with self.engine.connect() as connection:
            check_schema(connection)
            connection.rollback()

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Wipe the key copies and release the engine (if the plane created it). Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for key in (self._encryption_key, self._content_key):
            if key is not None:
                key.wipe()
        if self._correlate is not None:
            self._correlate.forget()
        if self._doorbell is not None:
            self._doorbell.close()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> AdmissionPlane:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AdmissionPlane {self.engine.url.render_as_string(hide_password=True)} {self.policy}>"

    @property
    def schema_version(self) -> int:
        """The seed ledger's version (``MAX(version)`` of ``schema_migrations``; 0 without one)."""
        from .schema_check import schema_version

        with self.engine.connect() as connection:
            return schema_version(connection)

    def _run(self, work: Callable[[Tx], Any], *, read_only: bool = False) -> Any:
        if self._closed:
            raise AdmissionStateError("admission plane is closed")
        return run(self.engine, work, read_only=read_only)

    # --- keys and journal ------------------------------------------------------------------

    def _require_encryption_key(self) -> SecretKey:
        if self._encryption_key is None:
            raise MissingKeyError("payload persistence requires an encryption key")
        return self._encryption_key

    def _require_content_key(self) -> SecretKey:
        if self._content_key is None:
            raise MissingKeyError("admission event correlation requires a content fingerprint key")
        return self._content_key

    def _correlation(self, request_id: str) -> str:
        self._require_content_key()
        assert self._correlate is not None
        return self._correlate(request_id)

    def _journal(self, tx: Tx, kind: str, request_id: str, from_state: str, to_state: str, now: int) -> None:
        v.identifier(request_id, "event correlation input")
        v.timestamp(now, "event timestamp")
        if not is_allowed_transition(kind, from_state, to_state):
            raise AdmissionStateError("admission event transition is not allowlisted")
        tx.execute(
            q.INSERT_EVENT,
            {
                "kind": str(kind),
                "from_state": str(from_state),
                "to_state": str(to_state),
                "now": now,
                "correlation_hmac": self._correlation(request_id),
            },
        )

    # --- enqueue and payloads -----------------------------------------------------------------

    def enqueue(
        self,
        *,
        request_id: str,
        session_id: str,
        agent_id: str,
        fingerprint: str,
        provider: str,
        model: str,
        now: int,
        owner_identity: ConnectorIdentity | None = None,
    ) -> EnqueueResult:
        """Queue a request without a payload (it is not admissible until one is persisted).

        Replaying the same metadata is idempotent (``existed=True``); different metadata
        for the same id raises :class:`AdmissionConflictError`.
        """
        meta = self._validate_enqueue(request_id, session_id, agent_id, fingerprint, provider, model, now)
        owner = self._owner(owner_identity)
        self._require_content_key()

        def work(tx: Tx) -> EnqueueResult:
            result = self._enqueue_request(tx, meta, now)
            self._bind_queued_owner(tx, request_id, owner, now, result.existed)
            return result

        return self._run(work)

    def enqueue_with_payload(
        self,
        *,
        request_id: str,
        session_id: str,
        agent_id: str,
        fingerprint: str,
        provider: str,
        model: str,
        now: int,
        plaintext: str,
        expires_at: int,
        owner_identity: ConnectorIdentity | None = None,
    ) -> EnqueueResult:
        """Queue a request and its sealed prompt atomically.

        The same request with the same prompt is idempotent; with a different prompt it
        raises :class:`PayloadConflictError` and changes nothing.
        """
        self._validate_expiry(now, expires_at)
        meta = self._validate_enqueue(request_id, session_id, agent_id, fingerprint, provider, model, now)
        owner = self._owner(owner_identity)
        v.plaintext(plaintext)
        fingerprint_hex = content_fingerprint(self._require_content_key(), request_id, plaintext)
        sealed = seal(self._require_encryption_key(), request_id, plaintext)

        def work(tx: Tx) -> EnqueueResult:
            result = self._enqueue_request(tx, meta, now)
            request = self._require_queued(tx, request_id)
            self._bind_queued_owner(tx, request_id, owner, now, result.existed, request)
            existing = tx.scalar(q.SELECT_PAYLOAD_FINGERPRINT, {"request_id": request_id})
            if existing is not None:
                if existing != fingerprint_hex:
                    raise PayloadConflictError()
                return EnqueueResult(request_id, True)
            self._insert_payload(tx, request_id, sealed, fingerprint_hex, expires_at, now)
            return result

        return self._run(work)

    def persist_payload(self, request_id: str, plaintext: str, now: int, expires_at: int) -> None:
        """Attach a sealed prompt to a queued request (idempotent for the same prompt)."""
        self._validate_expiry(now, expires_at)
        v.identifier(request_id, "payload request ID")
        v.plaintext(plaintext)
        fingerprint_hex = content_fingerprint(self._require_content_key(), request_id, plaintext)
        sealed = seal(self._require_encryption_key(), request_id, plaintext)

        def work(tx: Tx) -> None:
            self._require_queued(tx, request_id)
            existing = tx.scalar(q.SELECT_PAYLOAD_FINGERPRINT, {"request_id": request_id})
            if existing is not None:
                if existing != fingerprint_hex:
                    raise PayloadConflictError()
                return
            self._insert_payload(tx, request_id, sealed, fingerprint_hex, expires_at, now)

        self._run(work)

    def read_payload(self, request_id: str, now: int) -> str:
        """Decrypt a request's prompt for the dispatch write.

        At or after its expiry the payload is deleted (durably) and
        :class:`PayloadExpiredError` is raised; afterwards, or once the request went
        ``active`` or terminal, the read raises ``no payload is available``.
        """
        v.identifier(request_id, "payload request ID")
        v.timestamp(now, "payload read timestamp")
        key = self._require_encryption_key()

        def read(tx: Tx) -> Sequence[Any]:
            row = tx.one(q.SELECT_PAYLOAD, {"request_id": request_id})
            if row is None:
                raise AdmissionStateError("no payload is available")
            return row

        def delete_expired(tx: Tx) -> None:
            row = read(tx)
            if row[5] <= now:
                tx.execute(q.DELETE_PAYLOAD, {"request_id": request_id})

        # Read without the write lock; only an expired payload needs a writing transaction.
        row = self._run(read, read_only=True)
        if row[5] <= now:
            self._run(delete_expired)
            raise PayloadExpiredError()
        nonce, ciphertext, auth_tag, key_version, fingerprint_hex, _expires_at = row
        if fingerprint_hex is None:
            raise AdmissionStateError("request payload predates authenticated row binding")
        try:
            return open_sealed(
                key, request_id, SealedPayload(bytes(nonce), bytes(ciphertext), bytes(auth_tag), key_version)
            )
        except (InvalidTag, ValueError):
            raise PayloadIntegrityError() from None

    def cancel_queued(self, request_id: str, now: int) -> None:
        """Cancel a request that is still queued (after admission, cancelling needs evidence)."""
        v.identifier(request_id, "cancel request ID")
        v.timestamp(now, "cancel timestamp")

        def work(tx: Tx) -> None:
            self._require_queued(tx, request_id)
            tx.execute(q.CANCEL_QUEUED, {"request_id": request_id, "now": now})
            tx.ring(Bell.QUEUE)
            tx.execute(q.DELETE_PAYLOAD, {"request_id": request_id})
            self._journal(tx, K.REQUEST_CANCELLED, request_id, S.QUEUED, S.CANCELLED, now)

        self._run(work)

    # --- admission -----------------------------------------------------------------------------

    def admit_next(self, now: int, owner_instance_id: str) -> AdmittedLease | None:
        """Admit the next eligible request, or return ``None`` when nothing may start now.

        The rule: capacity first (seats, concurrent starts, the minimum start interval and
        the recent-reservation rule), then the oldest queued request with a payload whose
        provider/model is not cooling down, preferring agents that hold no seat.
        """
        v.identifier(owner_instance_id, "admission owner instance ID")
        v.timestamp(now, "admission timestamp")

        return self._run(lambda tx: self._admit_in_transaction(tx, now, owner_instance_id, None))

    def admit_request(self, request_id: str, now: int, owner_instance_id: str) -> AdmittedLease | None:
        """Admit ``request_id`` only if the global rule would choose exactly it now; never jumps the queue."""
        return self._admit_request(request_id, now, owner_instance_id, plan_wait=False)[0]

    def _admit_request(
        self, request_id: str, now: int, owner_instance_id: str, *, plan_wait: bool = True
    ) -> tuple[AdmittedLease | None, _Wake | None]:
        """:meth:`admit_request`, and when not admitted, what to wait for before looking again
        (``None``: the request is no longer queued, so there is nothing to wait for). Without
        ``plan_wait`` the look stops as soon as it knows the answer is "not now", and the
        returned wake is a plain "look again"."""
        v.identifier(request_id, "admission request ID")
        v.identifier(owner_instance_id, "admission owner instance ID")
        v.timestamp(now, "admission timestamp")
        # A read-only look first: with nothing to time out and ``request_id`` not the one the
        # rule would admit now, the attempt is a no-op, so waiting connectors look without
        # taking the write lock. The writing transaction re-checks everything, so the look
        # is only an optimisation, never a decision.
        wake = self._run(lambda tx: self._look(tx, request_id, now, plan_wait), read_only=True)
        if not isinstance(wake, _Verdict):
            return None, wake
        lease = self._run(lambda tx: self._admit_in_transaction(tx, now, owner_instance_id, request_id))
        # Lost a race (or something timed out meanwhile): look again after one short step.
        return lease, None if lease is not None else _Wake(at=now)

    def _look(self, tx: Tx, request_id: str, now: int, plan_wait: bool = True) -> _Wake | _Verdict | None:
        """``_WRITE`` if an admission attempt may succeed now; else what could change that
        (``None``: the request is not queued any more)."""
        if tx.one(q.ANY_EXPIRED, {"now": now}) is not None:
            return _WRITE
        candidate = self._select_candidate(tx, now)
        if candidate is not None and candidate[0] == request_id:
            block = self._capacity_block(tx, now, plan_wait=plan_wait)
            return _WRITE if block is None else block
        if not plan_wait:
            return _Wake()
        entry = tx.one(q.WAITER_ENTRY, {"request_id": request_id})
        if entry is None:
            state = tx.one(q.SELECT_REQUEST_STATE, {"request_id": request_id})
            # Queued without a payload: only ``persist_payload`` (or the fallback) helps.
            return _Wake() if state is not None and state[0] == S.QUEUED else None
        enqueued_at, agent_id, provider, model = entry
        cooling_until = tx.scalar(q.COOLDOWN_UNTIL, {"provider": provider, "model": model, "now": now})
        if cooling_until is not None:
            return _Wake(at=cooling_until)
        if tx.one(q.AGENT_HOLDS_SEAT, {"agent_id": agent_id}) is not None:
            # Picked only when no idle agent's request is eligible, or once our agent's seat is freed.
            return _Wake(queue=1, seats=True)
        # Each request leaving the queue makes at most one more agent busy or absent, so the
        # idle agents ahead of us can shrink by at most one per departure.
        ahead = tx.scalar(
            q.COUNT_IDLE_AGENTS_AHEAD, {"enqueued_at": enqueued_at, "request_id": request_id, "now": now}
        )
        return _Wake(queue=max(1, ahead))

    def _admit_in_transaction(
        self, tx: Tx, now: int, owner_instance_id: str, only_request_id: str | None
    ) -> AdmittedLease | None:
        """Time out expired requests, then admit the rule's choice (only if it is ``only_request_id``, when given)."""
        self._expire_queued(tx, now)
        if self._capacity_block(tx, now) is not None:
            return None
        candidate = self._select_candidate(tx, now)
        if candidate is None or (only_request_id is not None and candidate[0] != only_request_id):
            return None
        return self._reserve(tx, candidate, now, owner_instance_id)

    def wait_for_admission(
        self,
        request_id: str,
        owner_instance_id: str,
        *,
        timeout_ms: int | None = None,
        initial_delay_ms: float = 1.0,
        max_delay_ms: float = 4.0,
        sleep: Callable[[float], object] = time.sleep,
        on_wait: Callable[[int], object] | None = None,
        fallback_ms: int = DOORBELL_FALLBACK_MS,
    ) -> AdmittedLease | None:
        """Wait until ``request_id`` is admitted; ``None`` on timeout or once the request is no
        longer queued (timed out, cancelled, settled).

        The wait is driven by the database's doorbell (see :mod:`admission_plane._doorbell`):
        between admission looks the waiter only reads a few counters, every
        ``initial_delay_ms`` backing off to ``max_delay_ms`` (with jitter), and looks again
        when a request ahead of it left the queue, a seat or start slot it waits for was
        freed, a time it computed (end of a cooldown or of the start interval) has come, or
        ``fallback_ms`` (default :data:`DOORBELL_FALLBACK_MS`, 250) have passed: lower it if
        programs that do not ring (the original connector) free seats on the same database.
        Many waiters therefore cost almost nothing, and a freed seat is taken within about
        ``initial_delay_ms``. While there is no doorbell (an in-memory database, a
        PostgreSQL listener still connecting) it polls the look itself with the same back-off.

        ``on_wait(now)`` is called after every look that did not admit (e.g. to show the
        queue position). ``now`` comes from the plane's clock.
        """
        v.identifier(request_id, "admission request ID")
        v.identifier(owner_instance_id, "admission owner instance ID")
        if timeout_ms is not None:
            v.timestamp(timeout_ms, "admission wait timeout")
        v.positive_integer(fallback_ms, "admission wait fallback")
        deadline = None if timeout_ms is None else self._clock() + timeout_ms
        doorbell = self._doorbell
        delay = initial_delay_ms / 1000
        while True:
            seen = None if doorbell is None else doorbell.read()
            now = self._clock()
            lease, wake = self._admit_request(request_id, now, owner_instance_id)
            if lease is not None:
                return lease
            if wake is None or (deadline is not None and now >= deadline):
                return None
            if on_wait is not None:
                on_wait(now)
            if seen is not None and doorbell is not None:
                limit = min(moment for moment in (now + fallback_ms, wake.at, deadline) if moment is not None)
                self._await_doorbell(doorbell, seen, wake, limit, initial_delay_ms, max_delay_ms, sleep)
                continue
            if wake.queue and not (wake.seats or wake.starts or wake.at is not None):
                # Behind another request: ours may be next, so look again soon.
                sleep(BEHIND_DELAY_S * (0.5 + random.random()))  # noqa: S311 - jitter, not cryptography
                continue
            sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not cryptography
            delay = min(delay * 2, max_delay_ms / 1000)

    def _await_doorbell(
        self,
        doorbell: Doorbell | ListeningDoorbell,
        seen: Chimes,
        wake: _Wake,
        limit: int,
        initial_delay_ms: float,
        max_delay_ms: float,
        sleep: Callable[[float], object],
    ) -> None:
        """Sleep until ``wake`` is rung past ``seen`` or the plane's clock reaches ``limit``."""
        step = initial_delay_ms / 1000
        while True:
            sleep(step * (0.5 + random.random()))  # noqa: S311 - jitter, not cryptography
            current = doorbell.read()
            if current is None or wake.rung(seen, current) or self._clock() >= limit:
                return
            if not (wake.seats or wake.starts):  # not first in line: no hurry
                step = min(step * 2, max_delay_ms / 1000)

    def get_queue_snapshot(self, request_id: str, now: int) -> QueueSnapshot | None:
        """Where a queued request stands; ``None`` if it is unknown, not queued or has no payload."""
        v.identifier(request_id, "queue snapshot request ID")
        v.timestamp(now, "queue snapshot timestamp")

        def work(tx: Tx) -> QueueSnapshot | None:
            self._expire_queued(tx, now)
            entry = tx.one(q.SELECT_QUEUED_ENTRY, {"request_id": request_id})
            if entry is None:
                return None
            enqueued_at, provider, model = entry
            cooldown_until = tx.scalar(q.COOLDOWN_UNTIL, {"provider": provider, "model": model, "now": now})
            ahead = {"enqueued_at": enqueued_at, "request_id": request_id, "now": now}
            position = tx.scalar(q.COUNT_AHEAD, ahead)
            eligible = None if cooldown_until is not None else tx.scalar(q.COUNT_ELIGIBLE_AHEAD, ahead)
            return QueueSnapshot(
                request_id=request_id,
                position=position,
                eligible_position=eligible,
                enqueued_at=enqueued_at,
                waited_ms=max(0, now - enqueued_at),
                cooldown_until=cooldown_until,
            )

        return self._run(work)

    # --- lease lifecycle -------------------------------------------------------------------------

    def mark_starting(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """``admitted`` -> ``starting``, within the concurrent-start limit and the start interval."""
        fence = _fence(fence)
        v.timestamp(now, "start timestamp")
        interval = self.policy.min_start_interval_ms

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            if lease[4] != S.ADMITTED:
                raise AdmissionStateError("lease is not admitted")
            if tx.scalar(q.COUNT_STARTING_LEASES) >= self.policy.max_concurrent_starts:
                raise AdmissionStateError("concurrent start limit reached")
            tx.execute(q.DELETE_OLD_STARTS, {"cutoff": now - interval})
            latest = tx.scalar(q.LATEST_START)
            # With no minimum interval there is nothing to space out: a start stamped a little
            # before another connector's (clocks are read before the write lock) is not refused.
            if interval > 0 and latest is not None and now < latest + interval:
                raise AdmissionStateError("start interval has not elapsed")
            tx.execute(q.INSERT_START, {"lease_id": fence.lease_id, "now": now})
            self._set_phase(tx, lease, S.STARTING, now)

        self._run(work)

    def mark_dispatch_intent(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """``starting`` -> ``dispatch_intent`` without process evidence (the reaper will never release it)."""
        self._transition(_fence(fence), S.STARTING, S.DISPATCH_INTENT, now)

    def mark_active(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """``dispatch_intent`` -> ``active``; the payload is deleted in the same transaction."""
        fence = _fence(fence)
        v.timestamp(now, "activation timestamp")

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            if lease[4] != S.DISPATCH_INTENT:
                raise AdmissionStateError("lease is not dispatch_intent")
            self._set_phase(tx, lease, S.ACTIVE, now)
            # Once the irreversible write was issued, no recovery path may see the prompt again.
            tx.execute(q.DELETE_PAYLOAD, {"request_id": lease[1]})

        self._run(work)

    def mark_dispatch_ambiguous(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """``dispatch_intent`` -> ``dispatch_ambiguous``: capacity debt that is never requeued."""
        self._transition(_fence(fence), S.DISPATCH_INTENT, S.DISPATCH_AMBIGUOUS, now)

    def abandon_before_prompt(self, fence: LeaseFence | AdmittedLease, now: int, outcome: str) -> None:
        """End a reserved turn the connector can prove never wrote its prompt (terminal, never a requeue)."""
        fence = _fence(fence)
        v.timestamp(now, "pre-prompt abandonment timestamp")
        final = abandon_outcome(outcome)

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            if lease[4] not in ABANDONABLE_PHASES:
                raise AdmissionStateError("lease is not safely abandonable before prompt write")
            self._release_seat(tx, fence, lease[1], final, (K.REQUEST_ABANDONED, lease[4]), now)

        self._run(work)

    def mark_execution_recovery_required(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """Retain an uncertain dispatch as visible capacity debt: the seat stays held, the payload is deleted."""
        fence = _fence(fence)
        v.timestamp(now, "execution recovery timestamp")

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            phase = lease[4]
            if phase == S.RECOVERY_REQUIRED:
                return
            if phase not in EXECUTION_RECOVERY_PHASES:
                raise AdmissionStateError("lease cannot enter execution recovery")
            if tx.execute(q.LEASE_TO_RECOVERY, {**_fence_params(fence), "now": now}) != 1:
                raise LeaseFenceError()
            tx.execute(q.SET_REQUEST_TERMINAL, {"request_id": lease[1], "state": S.RECOVERY_REQUIRED, "now": now})
            self._journal(tx, K.REQUEST_RECOVERY_REQUIRED, lease[1], phase, S.RECOVERY_REQUIRED, now)
            tx.execute(q.DELETE_PAYLOAD, {"request_id": lease[1]})

        self._run(work)

    def release_exited_recovery_seat(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """Free the seat after connector, child and process group were all proved gone.

        The request ends ``recovery_required`` and can never be replayed.
        """
        fence = _fence(fence)
        v.timestamp(now, "exited recovery seat timestamp")

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            phase = lease[4]
            if phase in _TERMINAL_LEASE_PHASES:
                raise AdmissionStateError("lease is not an unresolved local execution")
            self._release_seat(
                tx, fence, lease[1], S.RECOVERY_REQUIRED, (K.REQUEST_RECOVERY_SEAT_RELEASED, phase), now
            )

        self._run(work)

    def complete_live_turn(
        self, fence: LeaseFence | AdmittedLease, now: int, completion: LiveTurnCompletion
    ) -> None:
        """Record an ``active`` turn's outcome and free its seat; a capacity failure cools its model down."""
        fence = _fence(fence)
        v.timestamp(now, "live turn completion timestamp")
        if not isinstance(completion, LiveTurnCompletion):
            raise InvalidInputError("live turn completion must be a LiveTurnCompletion")

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            if lease[4] != S.ACTIVE:
                raise AdmissionStateError("lease is not active")
            request = tx.one(q.SELECT_REQUEST_META, {"request_id": lease[1]})
            if request is None:
                raise UnknownRequestError()
            request_id = lease[1]
            tx.execute(q.SET_REQUEST_TERMINAL, {"request_id": request_id, "state": S.PROVIDER_TERMINAL, "now": now})
            self._journal(tx, K.REQUEST_PROVIDER_TERMINAL, request_id, S.ACTIVE, S.PROVIDER_TERMINAL, now)
            failure = completion.failure
            if failure is not None and failure.category is FailureCategory.PROVIDER_CAPACITY:
                tx.ring(Bell.EVERYONE)  # a cooldown can drop requests ahead of any waiter
                tx.execute(
                    q.UPSERT_COOLDOWN,
                    {
                        "provider": request[3],
                        "model": request[4],
                        "not_before": now + self.policy.capacity_cooldown_ms,
                        "now": now,
                    },
                )
            self._release_seat(
                tx, fence, request_id, completion.outcome, (K.REQUEST_RELEASED, S.PROVIDER_TERMINAL), now
            )

        self._run(work)

    def heartbeat(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """Refresh the lease's heartbeat and clear any suspicion; :class:`LeaseFenceError` if not owned."""
        fence = _fence(fence)
        v.timestamp(now, "heartbeat timestamp")

        def work(tx: Tx) -> None:
            if tx.execute(q.HEARTBEAT, {**_fence_params(fence), "now": now}) != 1:
                raise LeaseFenceError()

        self._run(work)

    def set_capacity_cooldown(self, provider: str, model: str, not_before: int, now: int) -> None:
        """Hold back ``provider``/``model`` until ``not_before``; a cooldown is never shortened."""
        if not v.is_safe_integer(not_before) or not v.is_safe_integer(now) or not_before < now:
            raise InvalidInputError(
                "capacity cooldown must use integer timestamps and cannot end before it is recorded"
            )
        v.metadata_text(provider, "provider")
        v.metadata_text(model, "model")
        params = {"provider": provider, "model": model, "not_before": not_before, "now": now}

        def work(tx: Tx) -> None:
            tx.execute(q.UPSERT_COOLDOWN, params)
            tx.ring(Bell.EVERYONE)  # a cooldown can drop requests ahead of any waiter

        self._run(work)

    def mark_suspect(self, fence: LeaseFence, now: int, reason: SuspectReason | str) -> bool:
        """Mark a lease suspect (keeps the first ``suspect_since``); ``False`` if the fence matches nothing."""
        fence = _fence(fence)
        v.timestamp(now, "lease suspect timestamp")
        try:
            reason = SuspectReason(reason)
        except ValueError:
            raise InvalidInputError("lease suspect reason is invalid") from None
        params = {**_fence_params(fence), "now": now, "reason": str(reason)}
        return self._run(lambda tx: tx.execute(q.MARK_SUSPECT, params) == 1)

    # --- dispatch intent ---------------------------------------------------------------------------

    def record_process_identity(self, record: DispatchRecord | object) -> DispatchIntentResult:
        """Persist verified process evidence and ``dispatch_intent`` in one transaction.

        Returns ``recorded`` (``idempotent`` for an exact replay) or ``not_recorded`` with a
        reason; never raises for contention or driver faults.
        """
        outcome = self._persist_dispatch_intent(record)
        if outcome.reason is None:
            return DispatchIntentResult("recorded", idempotent=outcome.idempotent)
        return DispatchIntentResult("not_recorded", reason=outcome.reason)

    def commit_dispatch_intent(self, record: DispatchRecord | object) -> DispatchIntentResult:
        """Same transaction as :meth:`record_process_identity`, reported as ``committed``/``not_committed``."""
        return self._persist_dispatch_intent(record)

    def _persist_dispatch_intent(self, record: DispatchRecord | object) -> DispatchIntentResult:
        normalized = _normalize_dispatch_record(record)
        if normalized is None:
            return _not_committed("invalid_process_identity")
        record = normalized
        driver_error = self.engine.dialect.loaded_dbapi.Error
        try:
            return self._run(lambda tx: self._dispatch_intent_in_transaction(tx, record))
        except Exception as error:  # noqa: BLE001 - a prompt writer must never see a raw or partial failure
            cause = error.__cause__ if isinstance(error.__cause__, driver_error) else error
            if contention_name(cause) is not None:
                winner = self._recheck_dispatch_after_contention(record)
                if winner is not None:
                    return winner
            return _not_committed("transaction_fault")

    def _dispatch_intent_in_transaction(self, tx: Tx, record: DispatchRecord) -> DispatchIntentResult:
        lease = tx.one(q.SELECT_LEASE, {"lease_id": record.lease_id})
        if lease is None or lease[1] != record.request_id or lease[2] != record.generation or (
            lease[3] != record.owner_instance_id
        ):
            return _not_committed("stale_lease")
        existing = tx.one(q.SELECT_IDENTITY, {"lease_id": record.lease_id})
        if lease[4] == S.DISPATCH_INTENT:
            if existing is not None and tuple(existing) == _identity_values(record):
                return DispatchIntentResult("committed", idempotent=True)
            return _not_committed("conflicting_intent")
        if lease[4] != S.STARTING:
            return _not_committed("stale_lease")
        if existing is not None:
            return _not_committed("conflicting_intent")
        committed_at = self._clock()
        fence = _fence_params(record.fence)
        if tx.execute(q.LEASE_TO_DISPATCH_INTENT, {**fence, "now": committed_at}) != 1:
            return _not_committed("stale_lease")
        tx.execute(
            q.INSERT_IDENTITY,
            {
                "lease_id": record.lease_id,
                "now": committed_at,
                "host_id": self.host_id,
                **dict(zip(q.IDENTITY_COLUMN_NAMES, _identity_values(record), strict=True)),
            },
        )
        hook = self._faults.after_process_identity_persisted
        if hook is not None:
            hook()
        changed = tx.execute(
            q.REQUEST_TO_DISPATCH_INTENT, {"request_id": record.request_id, "generation": record.generation}
        )
        if changed != 1:
            raise AdmissionStateError("lease and request state diverged at dispatch intent persistence")
        self._journal(tx, K.REQUEST_DISPATCH_INTENT, record.request_id, S.STARTING, S.DISPATCH_INTENT, committed_at)
        return DispatchIntentResult("committed", idempotent=False)

    def _recheck_dispatch_after_contention(self, record: DispatchRecord) -> DispatchIntentResult | None:
        """A writer that lost the lock may only inspect a committed, exact winner; it never retries the write."""
        for attempt in range(MAX_DISPATCH_CONTENTION_RECHECKS):
            try:
                outcome = self._run(lambda tx: _inspect_dispatch_winner(tx, record), read_only=True)
            except Exception as error:  # noqa: BLE001 - only contention keeps the recheck going
                if contention_name(error.__cause__ or error) is None:
                    return None
                outcome = "pending"
            if outcome != "pending":
                return outcome
            if attempt < MAX_DISPATCH_CONTENTION_RECHECKS - 1:
                time.sleep(DISPATCH_CONTENTION_RECHECK_DELAY_S)
        return None

    # --- reading ---------------------------------------------------------------------------------

    def read_sanitized_events(self, *, after_event_seq: int = 0, limit: int = 100) -> tuple[SanitizedEvent, ...]:
        """A page of the identifier-free journal, oldest first; tampered rows fail the whole read."""
        if not v.is_safe_integer(after_event_seq) or after_event_seq < 0:
            raise InvalidInputError("sanitized event cursor must be a non-negative safe integer")
        if not v.is_safe_integer(limit) or not 1 <= limit <= 1000:
            raise InvalidInputError("sanitized event page limit must be between 1 and 1000")
        rows = self._run(
            lambda tx: tx.all(q.SELECT_EVENTS, {"after": after_event_seq, "limit": limit}), read_only=True
        )
        return tuple(_sanitized_event(row) for row in rows)

    def get_request(self, request_id: str) -> StoredRequest | None:
        """A request's metadata and state, or ``None``."""
        v.identifier(request_id, "request ID")
        row = self._run(lambda tx: tx.one(q.SELECT_REQUEST, {"request_id": request_id}), read_only=True)
        if row is None:
            return None
        return StoredRequest(*row[:6], state=RequestState(row[6]), enqueued_at=row[7])

    def list_recoverable_dispatches(self) -> tuple[RecoverableDispatch, ...]:
        """Every seat-holding lease with its process evidence (or ``None``); never a payload.

        Raises :class:`RecoverableDispatchInventoryError` if any durable row cannot be trusted.
        """
        rows = self._run(lambda tx: tx.all(q.LIST_DISPATCHES), read_only=True)
        return tuple(dispatch_from_row(row) for row in rows)

    def list_recoverable_queued_owners(self) -> tuple[RecoverableQueuedOwner, ...]:
        """Queued requests with the connector identity that enqueued them."""
        rows = self._run(lambda tx: tx.all(q.LIST_QUEUED_OWNERS), read_only=True)
        return tuple(queued_owner_from_row(row) for row in rows)

    def settle_queued_owner_death(self, request_id: str, owner_instance_id: str, now: int) -> bool:
        """Cancel a queued request whose (proved dead) owner enqueued it; ``False`` if anything changed meanwhile."""
        v.identifier(request_id, "queued owner request ID")
        v.identifier(owner_instance_id, "queued owner instance ID")
        v.timestamp(now, "queued owner death timestamp")

        def work(tx: Tx) -> bool:
            request = tx.one(q.SELECT_REQUEST_STATE, {"request_id": request_id})
            if request is None or request[0] != S.QUEUED or request[1] != owner_instance_id:
                return False
            if tx.one(q.LEASE_EXISTS_FOR_REQUEST, {"request_id": request_id}) is not None:
                return False
            params = {"request_id": request_id, "owner_instance_id": owner_instance_id, "now": now}
            if tx.execute(q.SETTLE_QUEUED_OWNER, params) != 1:
                return False
            tx.ring(Bell.QUEUE)
            tx.execute(q.DELETE_PAYLOAD, {"request_id": request_id})
            self._journal(tx, K.QUEUED_OWNER_DEAD, request_id, S.QUEUED, S.CANCELLED, now)
            return True

        return self._run(work)

    # --- durable policy -----------------------------------------------------------------------------

    def claim_durable_policy(self, policy: Policy, owner_instance_id: str, now: int) -> None:
        """Record ``policy`` as the plane's shared policy, or check that the recorded one matches it."""
        fingerprint_hex = self._checked_policy_fingerprint(policy, owner_instance_id, now)
        policy.check_durable()

        def work(tx: Tx) -> None:
            params = {
                **attrs.asdict(policy),
                "policy_fingerprint": fingerprint_hex,
                "now": now,
                "owner_instance_id": owner_instance_id,
            }
            if tx.execute(q.INSERT_POLICY_IF_ABSENT, params) == 1:
                tx.ring(Bell.EVERYONE)  # the seat count may have changed
                return
            self._assert_policy_in_transaction(tx, policy, fingerprint_hex)

        self._run(work)

    def assert_durable_policy_match(self, policy: Policy, owner_instance_id: str, now: int) -> None:
        """Raise :class:`AdmissionRuntimeError` unless the durable policy equals ``policy``."""
        fingerprint_hex = self._checked_policy_fingerprint(policy, owner_instance_id, now)
        self._run(lambda tx: self._assert_policy_in_transaction(tx, policy, fingerprint_hex), read_only=True)

    def begin_soft_drain_to_1(self, owner_instance_id: str, now: int) -> None:
        """Start draining a steady three-seat policy to one seat (completes when no seat is held)."""
        v.identifier(owner_instance_id, "soft drain owner instance ID")
        v.timestamp(now, "soft drain timestamp")

        def work(tx: Tx) -> None:
            row = tx.one(q.SELECT_POLICY)
            if row is None:
                raise AdmissionRuntimeError("durable policy has not been claimed")
            drain_state = _drain_state(row[5])
            max_active = _policy_integer(row[0], "durable policy max_active_turns")
            if drain_state is DrainState.STEADY and max_active == 1:
                return
            if max_active != 3 and drain_state is not DrainState.SOFT_DRAINING_TO_1:
                raise AdmissionRuntimeError("soft drain can only start from a steady three-seat policy")
            if drain_state is DrainState.STEADY and tx.execute(
                q.START_DRAIN, {"now": now, "owner": owner_instance_id}
            ) != 1:
                raise AdmissionRuntimeError("soft drain could not be started atomically")
            tx.ring(Bell.EVERYONE)
            self._complete_soft_drain_if_settled(tx, owner_instance_id, now)

        self._run(work)

    # --- high-level turns ---------------------------------------------------------------------------

    def turn(self, **options: Any) -> Turn:
        """A :class:`~admission_plane.turn.Turn` on this plane: ``with plane.turn(...) as turn: ...``.

        It enqueues the prompt, waits for admission, starts the dispatch child, records its
        identity with the dispatch intent, heartbeats while the block runs and completes with
        the right outcome; see :class:`~admission_plane.turn.Turn` for the options.
        """
        from .turn import Turn

        return Turn(self, **options)

    # --- reaper ---------------------------------------------------------------------------------------

    def reap_suspects(self, now: int, readers: Any = None) -> ReaperSummary:
        """One reaper pass with process evidence from ``readers`` (default: this host's ``/proc``).

        See :func:`admission_plane.reaper.reap` for the rules. Never raises for one bad
        lease, never requeues.
        """
        from .reaper import reap

        return reap(self, now, readers)

    # --- internals ------------------------------------------------------------------------------------

    def _owner(self, owner_identity: ConnectorIdentity | None) -> ConnectorIdentity:
        if owner_identity is None:
            return self.owner_identity
        if not isinstance(owner_identity, ConnectorIdentity):
            raise InvalidInputError("owner identity must be a ConnectorIdentity")
        return owner_identity

    @staticmethod
    def _validate_enqueue(
        request_id: str, session_id: str, agent_id: str, fingerprint: str, provider: str, model: str, now: int
    ) -> dict[str, str]:
        meta = {
            "request_id": request_id,
            "session_id": session_id,
            "fingerprint": fingerprint,
            "provider": provider,
            "model": model,
        }
        for label, value in meta.items():
            v.metadata_text(value, label)
        if not isinstance(agent_id, str):
            raise InvalidInputError("invalid request metadata agent_id")
        v.identifier(agent_id, "request metadata agent_id")
        if not v.is_safe_integer(now) or now < 0:
            raise InvalidInputError("invalid request timestamp")
        # The seed reports this through its journal, after the other checks, before any write.
        v.identifier(request_id, "event correlation input")
        meta["agent_id"] = agent_id
        return meta

    @staticmethod
    def _validate_expiry(now: int, expires_at: int) -> None:
        if not v.is_safe_integer(now) or not v.is_safe_integer(expires_at) or expires_at <= now:
            raise InvalidInputError("payload expiry must be after persistence time")

    def _enqueue_request(self, tx: Tx, meta: dict[str, str], now: int) -> EnqueueResult:
        request_id = meta["request_id"]
        existing = tx.one(q.SELECT_REQUEST_META, {"request_id": request_id})
        if existing is not None:
            if tuple(existing) != (
                meta["session_id"], meta["agent_id"], meta["fingerprint"], meta["provider"], meta["model"]
            ):
                raise AdmissionConflictError()
            return EnqueueResult(request_id, True)
        tx.execute(q.INSERT_REQUEST, {**meta, "now": now, "deadline_at": now + self.policy.queue_timeout_ms})
        self._journal(tx, K.REQUEST_ENQUEUED, request_id, "absent", S.QUEUED, now)
        return EnqueueResult(request_id, False)

    def _bind_queued_owner(
        self,
        tx: Tx,
        request_id: str,
        owner: ConnectorIdentity,
        now: int,
        request_existed: bool,
        request: Sequence[Any] | None = None,
    ) -> None:
        """Record ``owner`` and bind the queued request to it (the seed's queued-owner reference).

        ``request`` is the request's ``(state, queued_owner_instance_id)`` row when the caller
        already read and checked it in this transaction.
        """
        stored = tx.one(q.SELECT_QUEUED_OWNER, {"owner_instance_id": owner.owner_instance_id})
        values = _owner_values(owner)
        if stored is None:
            tx.execute(q.INSERT_QUEUED_OWNER, {**values, "now": now, "host_id": self.host_id})
        elif tuple(stored) != tuple(values.values()):
            raise AdmissionConflictError()
        if request is None:
            request = self._require_queued(tx, request_id)
        if request[1] == owner.owner_instance_id:
            return
        if request[1] is not None:
            # Another connector enqueued it first; a replay keeps that first binding.
            if request_existed:
                return
            raise AdmissionConflictError()
        if tx.execute(q.BIND_QUEUED_OWNER, {"request_id": request_id, "owner_instance_id": owner.owner_instance_id,
                                            "now": now}) != 1:
            raise AdmissionConflictError()

    @staticmethod
    def _require_queued(tx: Tx, request_id: str) -> Sequence[Any]:
        """The request's ``(state, queued_owner_instance_id)``; refuses an unknown or non-queued request."""
        row = tx.one(q.SELECT_REQUEST_STATE, {"request_id": request_id})
        if row is None:
            raise UnknownRequestError()
        if row[0] != S.QUEUED:
            raise AdmissionStateError("request is no longer queued")
        return row

    @staticmethod
    def _insert_payload(
        tx: Tx, request_id: str, sealed: SealedPayload, fingerprint_hex: str, expires_at: int, now: int
    ) -> None:
        tx.execute(
            q.INSERT_PAYLOAD,
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

    def _expire_queued(self, tx: Tx, now: int) -> None:
        for (request_id,) in tx.all(q.SELECT_EXPIRED, {"now": now}):
            if tx.execute(q.TIME_OUT_REQUEST, {"request_id": request_id, "now": now}) == 1:
                tx.ring(Bell.QUEUE)
                tx.execute(q.DELETE_PAYLOAD, {"request_id": request_id})
                self._journal(tx, K.REQUEST_QUEUE_TIMED_OUT, request_id, S.QUEUED, S.QUEUE_TIMEOUT, now)

    def _capacity_block(self, tx: Tx, now: int, *, plan_wait: bool = False) -> _Wake | None:
        """``None`` if a seat may be taken now (seats, concurrent starts, the minimum start
        interval and the recent-reservation rule); else what could free one. Only with
        ``plan_wait`` does it look up when the start interval ends (two more statements that
        the admission transaction itself has no use for)."""
        policy_row = tx.one(q.SELECT_POLICY)
        seats = self.policy.max_active_turns
        if policy_row is not None:
            if _drain_state(policy_row[5]) is DrainState.SOFT_DRAINING_TO_1:
                return _Wake(queue=1, seats=True)  # the drain completes when the last seat is freed
            seats = _policy_integer(policy_row[0], "durable policy max_active_turns")
        # ``queue=1`` too: while capacity is full a departure is rare (a cancellation, a
        # time-out), and it may be this very request, which ends the wait.
        if tx.scalar(q.COUNT_SEAT_LEASES) >= seats:
            return _Wake(queue=1, seats=True)
        if tx.scalar(q.COUNT_START_WINDOW_LEASES) >= self.policy.max_concurrent_starts:
            return _Wake(queue=1, starts=True)
        interval = self.policy.min_start_interval_ms
        cutoff = {"cutoff": now - interval}
        if tx.one(q.RECENT_START, cutoff) is None and tx.one(q.RECENT_RESERVATION, cutoff) is None:
            return None
        if not plan_wait:
            return _Wake(queue=1, starts=True)
        latest = max(tx.scalar(q.LATEST_START) or 0, tx.scalar(q.LATEST_RESERVATION) or 0)
        return _Wake(queue=1, starts=True, at=max(now + 1, latest + interval))

    @staticmethod
    def _select_candidate(tx: Tx, now: int) -> Sequence[Any] | None:
        params = {"now": now}
        return tx.one(q.SELECT_CANDIDATE_IDLE_AGENT, params) or tx.one(q.SELECT_CANDIDATE_ANY, params)

    def _reserve(self, tx: Tx, candidate: Sequence[Any], now: int, owner_instance_id: str) -> AdmittedLease:
        request_id, previous_generation = candidate
        lease_id = str(uuid.uuid4())
        generation = previous_generation + 1
        if tx.execute(q.RESERVE_REQUEST, {"request_id": request_id, "generation": generation}) != 1:
            raise AdmissionStateError("selected admission request is no longer queued")
        tx.ring(Bell.QUEUE)
        tx.execute(
            q.INSERT_LEASE,
            {
                "lease_id": lease_id,
                "request_id": request_id,
                "generation": generation,
                "owner_instance_id": owner_instance_id,
                "now": now,
            },
        )
        self._journal(tx, K.REQUEST_ADMITTED, request_id, S.QUEUED, S.ADMITTED, now)
        return AdmittedLease(lease_id, request_id, generation, owner_instance_id)

    @staticmethod
    def _require_lease(tx: Tx, fence: LeaseFence) -> Sequence[Any]:
        lease = tx.one(q.SELECT_LEASE, {"lease_id": fence.lease_id})
        if lease is None:
            raise UnknownLeaseError()
        if lease[2] != fence.generation or lease[3] != fence.owner_instance_id:
            raise LeaseFenceError()
        return lease

    def _set_phase(self, tx: Tx, lease: Sequence[Any], phase: RequestState, now: int) -> None:
        lease_id, request_id, generation, owner, current = lease
        params = {"lease_id": lease_id, "owner_instance_id": owner, "generation": generation}
        if tx.execute(q.SET_LEASE_PHASE, {**params, "phase": str(phase), "now": now}) != 1:
            raise LeaseFenceError()
        tx.execute(q.SET_REQUEST_STATE, {"request_id": request_id, "state": str(phase)})
        if current in START_WINDOW_PHASES and phase not in START_WINDOW_PHASES:
            tx.ring(Bell.STARTS)
        self._journal(tx, LEASE_TRANSITIONS[(RequestState(current), phase)], request_id, current, phase, now)

    def _release_seat(
        self,
        tx: Tx,
        fence: LeaseFence,
        request_id: str,
        final: RequestState,
        event: tuple[EventKind, str],
        now: int,
    ) -> None:
        """End the request in ``final``, delete its payload and its lease (the seat), and journal
        ``event`` (kind, from-state); then complete a pending soft drain if no seat is left."""
        kind, from_state = event
        tx.execute(q.SET_REQUEST_TERMINAL, {"request_id": request_id, "state": str(final), "now": now})
        tx.execute(q.DELETE_PAYLOAD, {"request_id": request_id})
        if tx.execute(q.DELETE_LEASE, _fence_params(fence)) != 1:
            raise LeaseFenceError()
        tx.ring(Bell.SEATS | Bell.STARTS)
        self._journal(tx, kind, request_id, from_state, final, now)
        self._complete_soft_drain_if_settled(tx, fence.owner_instance_id, now)

    def _transition(self, fence: LeaseFence, expected: RequestState, target: RequestState, now: int) -> None:
        v.timestamp(now, "lease transition timestamp")

        def work(tx: Tx) -> None:
            lease = self._require_lease(tx, fence)
            if lease[4] != expected:
                raise AdmissionStateError(f"lease is not {expected}")
            self._set_phase(tx, lease, target, now)

        self._run(work)

    def _complete_soft_drain_if_settled(self, tx: Tx, owner_instance_id: str, now: int) -> None:
        row = tx.one(q.SELECT_POLICY)
        if row is None or _drain_state(row[5]) is not DrainState.SOFT_DRAINING_TO_1:
            return
        if tx.scalar(q.COUNT_SEAT_LEASES) != 0:
            return
        try:
            terminal = Policy(
                1,
                _policy_integer(row[1], "durable policy max_concurrent_starts"),
                _policy_integer(row[2], "durable policy min_start_interval_ms"),
                _policy_integer(row[3], "durable policy queue_timeout_ms"),
                _policy_integer(row[4], "durable policy capacity_cooldown_ms"),
            )
        except InvalidInputError as error:
            raise AdmissionRuntimeError(str(error)) from None
        params = {
            "max_concurrent_starts": terminal.max_concurrent_starts,
            "min_start_interval_ms": terminal.min_start_interval_ms,
            "queue_timeout_ms": terminal.queue_timeout_ms,
            "capacity_cooldown_ms": terminal.capacity_cooldown_ms,
            "policy_fingerprint": policy_fingerprint(self._require_content_key(), terminal.as_tuple()),
            "now": now,
            "owner": owner_instance_id,
        }
        tx.ring(Bell.EVERYONE)
        if tx.execute(q.COMPLETE_DRAIN, params) != 1:
            raise AdmissionRuntimeError("soft drain could not be completed atomically")
        self._journal(tx, K.POLICY_DRAIN_COMPLETED, POLICY_EVENT_ID, POLICY_SOFT_DRAINING_TO_1, POLICY_STEADY, now)

    def _checked_policy_fingerprint(self, policy: Policy, owner_instance_id: str, now: int) -> str:
        if not isinstance(policy, Policy):
            raise InvalidInputError("policy must be an admission_plane.Policy")
        v.identifier(owner_instance_id, "durable policy owner instance ID")
        v.timestamp(now, "durable policy timestamp")
        return policy_fingerprint(self._require_content_key(), policy.as_tuple())

    @staticmethod
    def _assert_policy_in_transaction(tx: Tx, policy: Policy, fingerprint_hex: str) -> None:
        row = tx.one(q.SELECT_POLICY)
        if row is None:
            raise AdmissionRuntimeError("durable policy has not been claimed")
        if tuple(row[:5]) != policy.as_tuple() or row[6] != fingerprint_hex:
            raise AdmissionRuntimeError("durable policy does not match shared runtime policy")


# --- helpers ---------------------------------------------------------------------------------------


def _fence(value: LeaseFence | AdmittedLease) -> LeaseFence:
    if isinstance(value, LeaseFence):
        return value
    if isinstance(value, AdmittedLease):
        return value.fence
    raise InvalidInputError("fence must be a LeaseFence or an AdmittedLease")


def _fence_params(fence: LeaseFence) -> dict[str, Any]:
    return {"lease_id": fence.lease_id, "owner_instance_id": fence.owner_instance_id, "generation": fence.generation}


def _not_committed(reason: str) -> DispatchIntentResult:
    return DispatchIntentResult("not_committed", reason=reason)


def _owner_values(owner: ConnectorIdentity) -> dict[str, Any]:
    process = owner.process
    return {
        "owner_instance_id": owner.owner_instance_id,
        "created_at": owner.created_at,
        "boot_id": process.boot_id,
        "pid": process.pid,
        "start_time_ticks": process.start_time_ticks,
        "pid_namespace_inode": process.pid_namespace_inode,
        "ppid": process.ppid,
        "pgrp": process.pgrp,
        "session": process.session,
    }


def _identity_values(record: DispatchRecord) -> tuple[Any, ...]:
    """The identity row of ``record``, in :data:`_queries.IDENTITY_COLUMN_NAMES` order."""
    connector, child = record.connector, record.child
    c = connector.process
    return (
        record.request_id, record.generation, record.owner_instance_id, str(record.prompt_channel),
        connector.owner_instance_id, connector.created_at, c.boot_id, c.pid, c.start_time_ticks,
        c.pid_namespace_inode, c.ppid, c.pgrp, c.session,
        child.boot_id, child.pid, child.start_time_ticks, child.pid_namespace_inode, child.ppid, child.pgrp,
        child.session,
    )


def _normalize_dispatch_record(record: object) -> DispatchRecord | None:
    """A :class:`DispatchRecord`, or the seed's camelCase mapping of one; ``None`` if invalid."""
    if isinstance(record, DispatchRecord):
        return record
    try:
        return dispatch_record_from_mapping(record)
    except (InvalidInputError, TypeError, ValueError, KeyError):
        return None


def _inspect_dispatch_winner(tx: Tx, record: DispatchRecord) -> DispatchIntentResult | str | None:
    lease = tx.one(q.SELECT_LEASE_WITH_REQUEST, {"lease_id": record.lease_id})
    if lease is None or lease[1] != record.request_id or lease[2] != record.generation or (
        lease[3] != record.owner_instance_id or lease[6] != record.generation
    ):
        return None
    identity = tx.one(q.SELECT_IDENTITY, {"lease_id": record.lease_id})
    if lease[4] == S.DISPATCH_INTENT and lease[5] == S.DISPATCH_INTENT:
        if identity is None or tuple(identity[:3]) != (record.request_id, record.generation, record.owner_instance_id):
            return None
        if tuple(identity) == _identity_values(record):
            return DispatchIntentResult("committed", idempotent=True)
        return _not_committed("conflicting_intent")
    if lease[4] == S.STARTING and lease[5] == S.STARTING and identity is None:
        return "pending"
    return None


_EVENT_KINDS = frozenset(str(member) for member in EventKind)


def _sanitized_event(row: Sequence[Any]) -> SanitizedEvent:
    seq, kind, from_state, to_state, occurred_at, correlation = row
    if not v.is_safe_integer(seq) or seq < 1:
        raise AdmissionStateError("sanitized event journal contains an invalid sequence")
    if kind not in _EVENT_KINDS or from_state not in EVENT_STATES or to_state not in EVENT_STATES:
        raise AdmissionStateError("sanitized event journal contains a non-allowlisted transition")
    if not v.is_safe_integer(occurred_at) or occurred_at < 0:
        raise AdmissionStateError("sanitized event timestamp must be a non-negative safe integer")
    if not isinstance(correlation, str) or len(correlation) != 64 or not all(
        char in "0123456789abcdef" for char in correlation
    ):
        raise AdmissionStateError("sanitized event journal contains an invalid correlation HMAC")
    if not is_allowed_transition(kind, from_state, to_state):
        raise AdmissionStateError("sanitized event journal contains a non-allowlisted transition")
    return SanitizedEvent(seq, kind, from_state, to_state, occurred_at, correlation)


def _drain_state(value: object) -> DrainState:
    try:
        return DrainState(value)
    except ValueError:
        raise AdmissionRuntimeError("durable policy drain state is invalid") from None


def _policy_integer(value: object, label: str) -> int:
    if not v.is_safe_integer(value) or value < 0:  # type: ignore[operator]
        raise AdmissionRuntimeError(f"{label} is invalid")
    return value  # type: ignore[return-value]


__all__ = ["AdmissionPlane", "FaultInjection", "wall_clock_ms"]


@attrs.frozen
class _Wake:
    """What a waiting connector waits for before its next admission look (see ``_doorbell``).

    ``queue``: that many requests must leave the queue first (0: departures do not
    matter); ``seats``/``starts``: a freed seat / start slot; ``at``: a plane-clock time
    after which time alone may change the answer. A change for everyone always counts.
    """

    queue: int = 0
    seats: bool = False
    starts: bool = False
    at: int | None = None

    def rung(self, seen: Chimes, current: Chimes) -> bool:
        """Whether the counters moved from ``seen`` to ``current`` in a way this waiter cares about."""
        moved = current.since(seen)
        return (
            min(moved.queue, moved.seats, moved.starts) >= EVERYONE_STEP
            or (self.queue > 0 and moved.queue >= self.queue)
            or (self.seats and moved.seats > 0)
            or (self.starts and moved.starts > 0)
        )


class _Verdict(enum.Enum):
    WRITE = "an admission attempt may succeed now"


_WRITE = _Verdict.WRITE
