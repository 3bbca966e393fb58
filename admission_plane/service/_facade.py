"""``AdmissionService``: every public operation of the plane, each a one-line call into its job module."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from .. import _validate as v
from ..clock import Clock, wall_clock_ms
from ..errors import InvalidInputError
from ..evidence import ConnectorIdentity
from ..host import default_host_id
from ..policy import Policy
from ..signals import Remaining
from ..states import EventKind, RequestState, SuspectReason
from ..store.doorbell import open_doorbell
from ..store.engine import redacted_url
from ..store.schema_check import schema_version
from ..values import (
    AdmittedLease,
    BudgetWindow,
    DispatchIntentResult,
    DispatchRecord,
    EnqueueResult,
    LeaseFence,
    LiveTurnCompletion,
    Pause,
    PolicyRevision,
    QueueSnapshot,
    RecoverableDispatch,
    RecoverableQueuedOwner,
    SanitizedEvent,
    StoredRequest,
)
from . import (
    _admission,
    _budgets,
    _control,
    _dispatch,
    _enqueue,
    _journal,
    _lifecycle,
    _payloads,
    _policy,
    _reads,
    _waiting,
)
from ._context import FaultInjection, PlaneContext, PlaneKeys
from ._facade_recovery import RecoveryOperations
from ._opening import open_engine, open_schema

S, K = RequestState, EventKind
Fence = LeaseFence | AdmittedLease


class AdmissionService(RecoveryOperations):
    """A durable, cross-process admission plane for agent turns (the operations; see :class:`AdmissionPlane`).

    Open it on a database URL (``sqlite:///path`` or ``postgresql+psycopg://...``), a
    filesystem path (an SQLite file) or an :class:`~sqlalchemy.Engine`. The schema must be
    at Alembic head (``alembic upgrade head``) unless ``migrate=True``; the integrity check
    runs on open and refuses a drifted database with
    :class:`~admission_plane.errors.SchemaIntegrityError`. A missing SQLite file is refused
    (not created) unless ``migrate=True``; a database shared with another application's
    tables needs ``allow_foreign_tables=True`` (as its migration did).

    Keys are 32 bytes: ``encryption_key`` seals payloads, ``content_fingerprint_key``
    keys the content, policy and journal HMACs (journalled operations need it). The plane
    copies them and wipes its copies on :meth:`close`. ``host_id`` names this host in
    recorded evidence (default: :func:`admission_plane.host.default_host_id`).

    Every operation is one transaction and takes the time (``now``, integer milliseconds)
    from the caller; only waiting reads ``clock`` (a callable returning integer milliseconds:
    a reading that is not a non-negative safe integer raises
    :class:`~admission_plane.errors.InvalidInputError`). Thread-safe: each operation checks
    out its own connection. An argument that is not what it must be raises
    :class:`~admission_plane.errors.InvalidInputError` before the database is opened.
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
        clock: Clock = wall_clock_ms,
        host_id: str | None = None,
        allow_foreign_tables: bool = False,
    ) -> None:
        policy = Policy() if policy is None else policy
        if not isinstance(policy, Policy):
            raise InvalidInputError("policy must be an admission_plane.Policy")
        keys = PlaneKeys(encryption_key, content_fingerprint_key)
        if fault_injection is not None and not isinstance(fault_injection, FaultInjection):
            raise InvalidInputError("fault injection must be a FaultInjection")
        v.hook(clock, "plane clock")
        if owner_identity is None:
            owner_identity = ConnectorIdentity.capture()
        elif not isinstance(owner_identity, ConnectorIdentity):
            raise InvalidInputError("owner identity must be a ConnectorIdentity")
        host = default_host_id() if host_id is None else v.identifier(host_id, "host ID")
        engine, owns = open_engine(database, migrate=migrate)
        self._ctx = PlaneContext(
            engine=engine,
            owns_engine=owns,
            policy=policy,
            keys=keys,
            owner_identity=owner_identity,
            host_id=host,
            clock=clock,
            faults=fault_injection or FaultInjection(),
            doorbell=None,
        )
        try:
            open_schema(engine, migrate=migrate, allow_foreign_tables=allow_foreign_tables)
            self._ctx.doorbell = open_doorbell(engine)  # its -writer.lock file only next to a sound database
        except BaseException:
            self.close()
            raise

    # --- the plane itself ----------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the plane runs on."""
        return self._ctx.engine

    @property
    def policy(self) -> Policy:
        """This plane's policy (a durable policy, once claimed, decides the seat count)."""
        return self._ctx.policy

    @property
    def owner_identity(self) -> ConnectorIdentity:
        """The connector identity this plane records as the owner of what it enqueues and admits."""
        return self._ctx.owner_identity

    @property
    def host_id(self) -> str:
        """The host this plane records in process evidence."""
        return self._ctx.host_id

    @property
    def schema_version(self) -> int:
        """The original's ledger version (``MAX(version)`` of ``schema_migrations``; 0 without one)."""
        return schema_version(self.engine)

    def close(self) -> None:
        """Wipe the key copies and release the engine (if the plane created it). Idempotent."""
        self._ctx.close()

    def __enter__(self) -> AdmissionService:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redacted_url(self.engine.url)} {self.policy}>"

    # --- the queue -----------------------------------------------------------------------------

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
        lane: str | None = None,
        estimated_tokens: int | None = None,
    ) -> EnqueueResult:
        """Queue a request without a payload (it is not admissible until one is persisted).

        ``lane`` names one of the policy's lanes (default: its first). ``estimated_tokens`` is
        what the turn is expected to use (input plus output): budgets reserve it at admission
        (see :class:`~admission_plane.Budget`); an estimate no budget window of the key could
        ever hold raises :class:`~admission_plane.errors.BudgetError`. Replaying the same
        metadata is idempotent (``existed=True``); different metadata (or estimate) for the
        same id raises :class:`~admission_plane.errors.AdmissionConflictError`. A policy that
        refuses requests beyond its per-session limit raises
        :class:`~admission_plane.errors.SessionLimitError`.
        """
        meta = _enqueue.metadata(
            request_id, session_id, agent_id, fingerprint, provider, model, now, lane, estimated_tokens
        )
        return _enqueue.enqueue(self._ctx, meta, _enqueue.owner(self._ctx, owner_identity), now)

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
        lane: str | None = None,
        estimated_tokens: int | None = None,
        admit_as: str | None = None,
    ) -> EnqueueResult:
        """Queue a request and its sealed prompt atomically (``lane`` and ``estimated_tokens`` as for :meth:`enqueue`).

        The same request with the same prompt is idempotent; with a different prompt it
        raises :class:`~admission_plane.errors.PayloadConflictError` and changes nothing.

        ``admit_as`` (an owner instance ID, usually ``owner_identity.owner_instance_id``): a new request is
        also admitted under it in the same transaction when :meth:`wait_for_admission` would admit it at once,
        and ``result.admitted`` holds the lease (one commit for both, instead of two); when it is ``None``, wait
        with :meth:`wait_for_admission` as usual. On PostgreSQL this is tried only under a policy with no keyed
        or session limit, budget or start interval (the server decides it, see the README's "Several
        machines"); otherwise the request is only enqueued. The turn API passes it.
        """
        _payloads.check_expiry(now, expires_at)
        meta = _enqueue.metadata(
            request_id, session_id, agent_id, fingerprint, provider, model, now, lane, estimated_tokens
        )
        if admit_as is not None:
            v.identifier(admit_as, "admission owner instance ID")
        connector = _enqueue.owner(self._ctx, owner_identity)
        return _payloads.enqueue_with_payload(self._ctx, meta, connector, now, plaintext, expires_at, admit_as)

    def persist_payload(self, request_id: str, plaintext: str, now: int, expires_at: int) -> None:
        """Attach a sealed prompt to a queued request (idempotent for the same prompt)."""
        _payloads.persist(self._ctx, request_id, plaintext, now, expires_at)

    def read_payload(self, request_id: str, now: int) -> str:
        """Decrypt a request's prompt for the dispatch write.

        At or after its expiry the payload is deleted (durably) and
        :class:`~admission_plane.errors.PayloadExpiredError` is raised; afterwards, or once
        the request went ``active`` or terminal, the read raises ``no payload is available``.
        """
        return _payloads.read(self._ctx, request_id, now)

    def cancel_queued(self, request_id: str, now: int) -> None:
        """Cancel a request that is still queued (after admission, cancelling needs evidence)."""
        _enqueue.cancel_queued(self._ctx, request_id, now)

    def get_queue_snapshot(self, request_id: str, now: int) -> QueueSnapshot | None:
        """Where a queued request stands; ``None`` if it is unknown, not queued or has no payload."""
        return _reads.queue_snapshot(self._ctx, request_id, now)

    # --- admission -----------------------------------------------------------------------------

    def admit_next(self, now: int, owner_instance_id: str) -> AdmittedLease | None:
        """Admit the next eligible request, or return ``None`` when nothing may start now.

        The rule: capacity first (seats, concurrent starts, the minimum start interval and
        the recent-reservation rule), then the oldest queued request with a payload whose
        provider/model is not cooling down, preferring agents that hold no seat.
        """
        return _admission.admit_next(self._ctx, now, owner_instance_id)

    def admit_request(self, request_id: str, now: int, owner_instance_id: str) -> AdmittedLease | None:
        """Admit ``request_id`` only if the global rule would choose exactly it now; never jumps the queue."""
        return _admission.admit_request(self._ctx, request_id, now, owner_instance_id, plan_wait=False)[0]

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
        fallback_ms: int = _waiting.DOORBELL_FALLBACK_MS,
        start: bool = False,
    ) -> AdmittedLease | None:
        """Wait until ``request_id`` is admitted; ``None`` on timeout or once the request is no
        longer queued (timed out, cancelled, settled).

        It is admitted when the admission rule chooses it, or (beyond the original) beside the
        rule's first choices when none of them can lose its seat by it: the policy sets no keyed
        limit, session limit, budget or start interval, the queue holds one lane, its agent holds
        no seat, and there are free seats and start slots for every request ahead of it and for
        it. :meth:`admit_request` keeps the original's strict rule.

        The wait is driven by the database's doorbell (see :mod:`admission_plane.store.doorbell`):
        between admission looks the waiter only reads a few counters, and looks again
        when a request ahead of it left the queue, a seat or start slot it waits for was
        freed, a time it computed (end of a cooldown or of the start interval) has come, or
        ``fallback_ms`` (default 250) have passed: lower it if programs that do not ring
        (the original connector) free seats on the same database. On SQLite under Linux, with
        the real ``time.sleep``, the waiter sleeps on an inotify watch of the doorbell and reads
        the counters when a ring wakes it (and at least every 50 ms, for its clock), so it takes a
        freed seat at the ring (two or more departures from its turn, it naps between reads
        instead, for half the time they would take at the rate it has seen); elsewhere (or with
        another ``sleep``) it reads them every ``initial_delay_ms`` backing off to
        ``max_delay_ms`` (with jitter), and a freed seat is taken within about
        ``initial_delay_ms``. Many waiters therefore cost almost nothing.
        On PostgreSQL the counters are pushed (``LISTEN``): the waiter blocks until a ring or
        the next moment its clock matters, and takes a freed seat at the ring. While there is
        no doorbell (a PostgreSQL listener still connecting) it polls the look itself with the
        same back-off.

        On SQLite, a wait that follows the enqueue (``enqueue_with_payload(admit_as=...)``) whose
        admission of the same request, for the same owner, admitted nothing starts from what that
        enqueue found under the write lock, without a look of its own first.

        With ``start=True`` the admission also moves the lease to ``starting`` in its own
        transaction where :meth:`mark_starting` would allow it at that moment (on SQLite, where
        every writer waits for one write lock: a waiter then costs one writing transaction, and one
        durable commit, fewer). The returned lease says whether it did (``lease.starting``); if
        not (PostgreSQL, or a start the limits refused), call :meth:`mark_starting` as usual. The
        turn API passes it.

        ``on_wait(now)`` is called after every look that did not admit (e.g. to show the
        queue position). ``now`` comes from the plane's clock. Delays that are not positive
        finite numbers, a ``sleep`` or ``on_wait`` that cannot be called and a ``start`` that is
        not a ``bool`` raise :class:`~admission_plane.errors.InvalidInputError` before the first look.
        """
        return _waiting.wait_for_admission(
            self._ctx,
            request_id,
            owner_instance_id,
            timeout_ms=timeout_ms,
            initial_delay_ms=initial_delay_ms,
            max_delay_ms=max_delay_ms,
            sleep=sleep,
            on_wait=on_wait,
            fallback_ms=fallback_ms,
            start=start,
        )

    # --- the lease lifecycle -------------------------------------------------------------------

    def mark_starting(self, fence: Fence, now: int) -> None:
        """``admitted`` -> ``starting``, within the concurrent-start limit and the start interval."""
        _lifecycle.mark_starting(self._ctx, _lifecycle.fence_of(fence), now, _lifecycle.request_of(fence))

    def mark_dispatch_intent(self, fence: Fence, now: int) -> None:
        """``starting`` -> ``dispatch_intent`` without process evidence (the reaper will never release it)."""
        _lifecycle.move(self._ctx, _lifecycle.fence_of(fence), K.REQUEST_DISPATCH_INTENT, S.STARTING,
                        S.DISPATCH_INTENT, now, _lifecycle.request_of(fence))  # fmt: skip

    def mark_active(self, fence: Fence, now: int) -> None:
        """``dispatch_intent`` -> ``active``; the payload is deleted in the same transaction."""
        _lifecycle.move(self._ctx, _lifecycle.fence_of(fence), K.REQUEST_ACTIVE, S.DISPATCH_INTENT, S.ACTIVE, now,
                        _lifecycle.request_of(fence))  # fmt: skip

    def mark_dispatch_ambiguous(self, fence: Fence, now: int) -> None:
        """``dispatch_intent`` -> ``dispatch_ambiguous``: capacity debt that is never requeued."""
        _lifecycle.move(self._ctx, _lifecycle.fence_of(fence), K.REQUEST_DISPATCH_AMBIGUOUS, S.DISPATCH_INTENT,
                        S.DISPATCH_AMBIGUOUS, now, _lifecycle.request_of(fence))  # fmt: skip

    def abandon_before_prompt(self, fence: Fence, now: int, outcome: str) -> None:
        """End a reserved turn the connector can prove never wrote its prompt (terminal, never a requeue)."""
        _lifecycle.abandon_before_prompt(self._ctx, _lifecycle.fence_of(fence), now, outcome)

    def mark_execution_recovery_required(self, fence: Fence, now: int) -> None:
        """Retain an uncertain dispatch as visible capacity debt: the seat stays held, the payload is deleted."""
        _lifecycle.mark_execution_recovery_required(self._ctx, _lifecycle.fence_of(fence), now)

    def release_exited_recovery_seat(self, fence: Fence, now: int) -> None:
        """Free the seat after connector, child and process group were all proved gone.

        The request ends ``recovery_required`` and can never be replayed.
        """
        _lifecycle.release_exited_recovery_seat(self._ctx, _lifecycle.fence_of(fence), now)

    def complete_live_turn(self, fence: Fence, now: int, completion: LiveTurnCompletion) -> None:
        """Record an ``active`` turn's outcome and free its seat; a capacity failure cools its model down."""
        _lifecycle.complete_live_turn(self._ctx, _lifecycle.fence_of(fence), now, completion,
                                      _lifecycle.request_of(fence))  # fmt: skip

    def heartbeat(self, fence: Fence, now: int) -> None:
        """Refresh the lease's heartbeat and clear any suspicion; :class:`LeaseFenceError` if not owned."""
        _lifecycle.heartbeat(self._ctx, _lifecycle.fence_of(fence), now)

    def mark_suspect(self, fence: Fence, now: int, reason: SuspectReason | str) -> bool:
        """Mark a lease suspect (keeps the first ``suspect_since``); ``False`` if the fence matches nothing."""
        return _lifecycle.mark_suspect(self._ctx, _lifecycle.fence_of(fence), now, reason)

    def set_capacity_cooldown(self, provider: str, model: str, not_before: int, now: int) -> None:
        """Hold back ``provider``/``model`` until ``not_before``; a cooldown is never shortened."""
        _lifecycle.set_capacity_cooldown(self._ctx, provider, model, not_before, now)

    # --- budgets ---------------------------------------------------------------------------------

    def record_external_usage(
        self, provider: str, model: str | None = None, *, requests: int = 0, tokens: int = 0, now: int | None = None
    ) -> None:
        """Charge usage spent outside the plane (another tool on the same account) to ``provider``/``model``
        (``model=None``: the provider as a whole), so its budgets count everything the account spent.

        Journalled as ``budget_usage_recorded`` without the key or the amounts.
        """
        _budgets.record_external_usage(self._ctx, provider, model, requests, tokens, self._now(now))

    def correct_budget(
        self,
        provider: str,
        model: str,
        remaining: Remaining | Mapping[str, str],
        *,
        window_ms: int = _budgets.HEADER_WINDOW_MS,
        now: int | None = None,
    ) -> tuple[BudgetWindow, ...]:
        """Correct the key's budget windows downward to what the provider says remains; never upward.

        ``remaining`` is a :class:`~admission_plane.signals.Remaining` or a response's headers
        (``x-ratelimit-remaining-*``, ``anthropic-ratelimit-*-remaining``; headers without
        such a figure change nothing). ``window_ms`` names the windows the figures are for
        (default: a minute, the window of OpenAI's and Anthropic's remaining-budget headers; a key
        without a window of that length is left as it is). Returns those windows afterwards.
        """
        return _budgets.correct(self._ctx, provider, model, remaining, self._now(now), window_ms)

    def budget_status(self, now: int | None = None) -> tuple[BudgetWindow, ...]:
        """Every window of every budget of the policy in force: use, reservations, remaining, next reset."""
        return _budgets.status(self._ctx, self._now(now))

    def _now(self, now: int | None) -> int:
        return self._ctx.now() if now is None else now

    # --- the dispatch intent -------------------------------------------------------------------

    def record_process_identity(self, record: DispatchRecord | object) -> DispatchIntentResult:
        """Persist verified process evidence and ``dispatch_intent`` in one transaction.

        Returns ``recorded`` (``idempotent`` for an exact replay) or ``not_recorded`` with a
        reason; never raises for contention or driver faults.
        """
        return _dispatch.as_recorded(_dispatch.persist(self._ctx, record))

    def commit_dispatch_intent(self, record: DispatchRecord | object) -> DispatchIntentResult:
        """Same transaction as :meth:`record_process_identity`, reported as ``committed``/``not_committed``."""
        return _dispatch.persist(self._ctx, record)

    # --- reads and recovery inventory ----------------------------------------------------------

    def read_sanitized_events(self, *, after_event_seq: int = 0, limit: int = 100) -> tuple[SanitizedEvent, ...]:
        """A page of the identifier-free journal, oldest first; tampered rows fail the whole read."""
        return _journal.read_page(self._ctx, after_event_seq, limit)

    def get_request(self, request_id: str) -> StoredRequest | None:
        """A request's metadata and state, or ``None``."""
        return _reads.get_request(self._ctx, request_id)

    def list_recoverable_dispatches(self) -> tuple[RecoverableDispatch, ...]:
        """Every seat-holding lease with its process evidence (or ``None``); never a payload.

        Raises :class:`~admission_plane.errors.RecoverableDispatchInventoryError` if any
        durable row cannot be trusted.
        """
        return _reads.recoverable_dispatches(self._ctx)

    def list_recoverable_queued_owners(self) -> tuple[RecoverableQueuedOwner, ...]:
        """Queued requests with the connector identity that enqueued them."""
        return _reads.recoverable_queued_owners(self._ctx)

    def settle_queued_owner_death(self, request_id: str, owner_instance_id: str, now: int) -> bool:
        """Cancel a queued request whose (proved dead) owner enqueued it; ``False`` if anything changed meanwhile."""
        return _enqueue.settle_owner_death(self._ctx, request_id, owner_instance_id, now)

    # --- durable policy ------------------------------------------------------------------------

    def claim_durable_policy(self, policy: Policy, owner_instance_id: str, now: int) -> None:
        """Record ``policy`` as the plane's shared policy, or check that the recorded one matches it."""
        _policy.claim(self._ctx, policy, owner_instance_id, now)

    def assert_durable_policy_match(self, policy: Policy, owner_instance_id: str, now: int) -> None:
        """Raise :class:`~admission_plane.errors.AdmissionRuntimeError` unless the durable policy equals ``policy``."""
        _policy.assert_match(self._ctx, policy, owner_instance_id, now)

    def begin_soft_drain_to_1(self, owner_instance_id: str, now: int) -> None:
        """Start draining a steady three-seat policy to one seat (completes when no seat is held)."""
        _policy.begin_soft_drain(self._ctx, owner_instance_id, now)

    # --- live policy and pauses (policy v2) ----------------------------------------------------

    def current_policy(self) -> PolicyRevision:
        """The policy in force and its revision (0 until :meth:`set_policy` was first called)."""
        return _policy.current(self._ctx)

    def set_policy(self, policy: Policy, *, now: int | None = None) -> PolicyRevision:
        """Put ``policy`` in force as the next live revision: every connector applies it at its
        next transaction, without a restart.

        Lowering a limit never preempts a running turn; admission waits until the lower
        limit holds. A soft drain in progress ends. The journal records ``policy_revised``
        (no identifier). Values the durable row refuses raise
        :class:`~admission_plane.errors.InvalidInputError` and change nothing.
        """
        return _policy.set_policy(self._ctx, policy, self._ctx.now() if now is None else now)

    def policy_history(self, limit: int = 20) -> tuple[PolicyRevision, ...]:
        """The newest ``limit`` (1-1000) live policy revisions, newest first."""
        return _policy.history(self._ctx, limit)

    def pause(
        self, *, lane: str | None = None, provider: str | None = None, model: str | None = None, now: int | None = None
    ) -> bool:
        """Pause admission: everything (no argument), one ``lane``, or one ``provider``/``model`` key.

        Running turns go on and queue time-outs still apply. Returns ``False`` if the scope
        was paused already. Journalled as ``admission_paused`` with the scope's kind only.
        """
        return _control.pause(self._ctx, lane, provider, model, self._ctx.now() if now is None else now)

    def resume(
        self, *, lane: str | None = None, provider: str | None = None, model: str | None = None, now: int | None = None
    ) -> bool:
        """Resume admission in a scope paused with the same arguments; waiters look again at once.

        Returns ``False`` if the scope was not paused.
        """
        return _control.resume(self._ctx, lane, provider, model, self._ctx.now() if now is None else now)

    def pauses(self) -> tuple[Pause, ...]:
        """Every paused scope."""
        return _control.pauses(self._ctx)
