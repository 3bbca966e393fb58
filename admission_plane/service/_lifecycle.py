"""A lease from admission to its end: starting, active, the ways it gives its seat back, heartbeats.

Each operation reads the fenced lease in its transaction, checks the phase it accepts
(with the original's message), and applies one edge of the transition table through
:func:`~admission_plane.service._transitions.change`. The dispatch intent, which also
records process evidence, is :mod:`._dispatch`.

Locking (PostgreSQL; SQLite serialises every writer on its write lock). Every operation
here is a *lease unit* (``Gate.LEASE``, :mod:`admission_plane.store.unit_of_work`): it
takes the lease gate shared for the whole unit and the admission gate shared in its
commit's round trip, so lease units run and commit beside each other and beside
admissions and enqueues; only ``Gate.EXCLUSIVE`` units (policy changes, pauses, cancels,
the reaper's queued-owner settlements) never overlap one. Taking the admission gate at
commit puts each lease unit wholly before an admission (committed before its first read)
or wholly after it (committed after it). A start with no start interval and a dispatch
intent skip it (``Tx.count_neutral``): they change nothing admission counts or reads.
Why that is enough, operation by operation:

* Every one reads its lease first with ``SELECT ... FOR UPDATE`` (heartbeat and suspicion
  are a single fenced ``UPDATE``, which locks the row itself). Two units of one lease
  therefore run one after the other, and the second reads the first's committed phase:
  the fence and the phase check are exact, as under a global lock.
* The request row, its payload and its process evidence are written only by units of its
  lease once it is leased (admission writes a request only while it is queued, and
  ``Gate.EXCLUSIVE`` units never overlap a lease unit), so the lease row lock covers them
  too; the journal is append-only.
* A freed seat settles its request's budget reservation (``service._budgets``): one update or
  delete of the request's own charge row, which only units of its lease write after admission.
* Against an admission running beside it. What a lease unit writes that admission reads
  only shrinks what admission counts (a seat freed, a lease leaving the start window), or is
  a start (``start_history``, for the interval), a cooldown, or a settled budget that used
  more than it reserved; admission reads each of them committed or not at all, and whichever
  it read, the order of the two units' commits is one in which each saw what it relied on
  (the admission gate at commit, above). What a lease unit reads that an admission writes:
  a new lease in the start window, read by ``mark_starting``'s shared path below, whose
  argument holds whatever admission does beside it; and the seats a soft drain's completion
  counts, for which that unit takes the admission gate before counting (below). Nothing
  else a lease unit reads is written by admission: the policy is written only by
  ``Gate.EXCLUSIVE`` units (a drain's completion aside, below).
* What a lease unit reads that another lease unit may change beside it:

  - ``mark_starting``: the concurrent-start limit and the start interval (it counts
    starting leases and reads ``start_history``). It reads the number of leases in the whole
    start window with its lease (one statement, one snapshot with the policy). When that
    number is no more than the limit and the interval is 0 (nothing to space out), the start
    needs no count: starting leases, a subset of the window, stay within the limit whatever
    other starters do, because only admission grows the window, never past the limit (it
    checks under its own gate), and the limit cannot change beside a lease unit. Such a
    start takes the start lock (``START_LOCK_KEY``) shared in its commit's round trip, so it
    costs no round trip; any other start takes it exclusively before counting, which holds
    back every shared start's commit until its own: nothing can start between its count (and
    latest-start read) and its commit, so they are exact. (An exclusive starter whose window
    read is older than a shared starter's saw the window shrink since; the shared starter's
    argument above covers both.) No starter holds the lock shared while it waits to take it
    exclusively, so starters never deadlock over it. ``start_history`` rows are deleted with
    ``SKIP LOCKED``, so two shared starters never wait for each other over them.
  - Freeing a seat while a soft drain is pending: the drain completes when no seat is held,
    but two units freeing the last two seats would each still count the other's. The
    drain state cannot change beside a lease unit but by such a completion (starting a
    drain and revising the policy are ``Gate.EXCLUSIVE`` units), so a unit that reads
    "steady" needs nothing more; one that reads "draining" takes the admission gate shared
    (no admission may take a seat while it counts) and then the drain lock
    (``DRAIN_LOCK_KEY``) exclusively before counting, held to commit, so the last of them
    counts after every other has committed and completes it.
  - A capacity failure's cooldown is an upsert of one row (``greatest`` of the two ends):
    concurrent ones queue on that row and both extensions survive.
* Units sent whole (PostgreSQL with the session functions, given the :class:`AdmittedLease`:
  ``PlaneContext.run_sent``). Starting with no start interval, active (and the other plain moves of
  :func:`move`) and a live turn's completion read nothing first; so does the dispatch intent
  (:mod:`._dispatch`). Their first statement, sent with the commit, is the lease's fenced update or
  delete, which takes the lease's row lock, and it checks on the server, in its snapshot (taken after
  the unit's gate), what the long way reads first with that lock: the fence and phase; for a start, the
  start window within the limit and the durable policy's revision (the limit is the plane's for the
  revision it last read, so the shared start's argument above holds as it is); for a dispatch
  intent, that no evidence is recorded; for a completion, that there is no budget reservation to settle
  and no soft drain pending (the two things the long way reads to free a seat). The rest of the unit
  follows it in the same transaction, so it relies on exactly what the long way relies on; when any
  check fails, the commit fails, nothing is committed, and the long way runs.
"""

from __future__ import annotations

from .. import _validate as v
from ..errors import AdmissionStateError, InvalidInputError, LeaseFenceError, UnknownLeaseError, UnknownRequestError
from ..states import (
    ABANDONABLE_PHASES,
    EXECUTION_RECOVERY_PHASES,
    LIVE_OUTCOMES,
    OPERATOR_RELEASE_OUTCOMES,
    OWNER_DEATH_OUTCOME,
    OWNER_DEATH_PHASES,
    RELEASABLE_PHASES,
    DrainState,
    EventKind,
    FailureCategory,
    RequestState,
    SuspectReason,
)
from ..store.doorbell import Bell
from ..store.rows import LeaseRow, PolicyRow
from ..store.statements.leases import (
    COUNT_STARTING_LEASES,
    DELETE_OLD_STARTS,
    HEARTBEAT,
    INSERT_START,
    LATEST_START,
    MARK_SUSPECT,
    SELECT_LEASE_FOR_UPDATE,
    SELECT_START_READS,
    UPSERT_COOLDOWN,
)
from ..store.statements.policy import SELECT_POLICY
from ..store.statements.requests import SELECT_REQUEST_META
from ..store.tx import Tx
from ..store.unit_of_work import ADMISSION_GATE_SHARED, DRAIN_LOCK, SHARED_START_LOCK, START_LOCK, Gate
from ..values import AdmittedLease, LeaseFence, LiveTurnCompletion, ReleasedLease, Usage, abandon_outcome
from ._budgets import settle
from ._context import PlaneContext
from ._policy import complete_drain_if_settled, effective, effective_of
from ._transitions import change, edge, end_sent, end_unread, free_lease, move_sent, move_unread

S, K = RequestState, EventKind


def fence_of(value: LeaseFence | AdmittedLease) -> LeaseFence:
    """The fence of a lease argument (a :class:`LeaseFence` or the :class:`AdmittedLease` admission returned)."""
    if isinstance(value, LeaseFence):
        return value
    if isinstance(value, AdmittedLease):
        return value.fence
    raise InvalidInputError("fence must be a LeaseFence or an AdmittedLease")


def request_of(value: LeaseFence | AdmittedLease) -> str | None:
    """The request an :class:`AdmittedLease` names (``None`` for a bare :class:`LeaseFence`, or an ID no
    request could have): what lets a lease unit send its move with its commit (``move_sent``)."""
    if isinstance(value, AdmittedLease) and v.is_identifier(value.request_id):
        return value.request_id
    return None


def fence_params(fence: LeaseFence) -> dict[str, object]:
    """The fence as statement parameters."""
    return {"lease_id": fence.lease_id, "owner_instance_id": fence.owner_instance_id, "generation": fence.generation}


def require_lease(tx: Tx, fence: LeaseFence) -> LeaseRow:
    """The lease ``fence`` names, row-locked to the end of the transaction; :class:`UnknownLeaseError`
    or :class:`LeaseFenceError` otherwise."""
    return _fenced(tx.one(SELECT_LEASE_FOR_UPDATE, {"lease_id": fence.lease_id}), fence)


def _fenced(lease: LeaseRow | None, fence: LeaseFence) -> LeaseRow:
    """``lease`` (the row ``fence`` names, read), if it matches the fence."""
    if lease is None:
        raise UnknownLeaseError()
    if lease.generation != fence.generation or lease.owner_instance_id != fence.owner_instance_id:
        raise LeaseFenceError()
    return lease


def _in_phase(tx: Tx, fence: LeaseFence, phases: frozenset[RequestState], refusal: str) -> LeaseRow:
    return _phased(require_lease(tx, fence), phases, refusal)


def _phased(lease: LeaseRow, phases: frozenset[RequestState], refusal: str) -> LeaseRow:
    """``lease``, if it is in one of ``phases``; :class:`AdmissionStateError` (``refusal``) otherwise."""
    if lease.phase not in phases:
        raise AdmissionStateError(refusal)
    return lease


def _start_reads(tx: Tx, lease_id: str) -> tuple[LeaseRow | None, PolicyRow | None, int]:
    """PostgreSQL: the lease, row-locked, the durable policy row and the number of leases in the start
    window, in one statement (``SELECT_START_READS``)."""
    row = tx.row(SELECT_START_READS, {"lease_id": lease_id})
    if row is None:
        return None, None, 0
    *lease, policy, window = row
    return LeaseRow.from_row(lease), None if policy is None else PolicyRow.from_row(policy), int(window)


def _free_seat(
    ctx: PlaneContext,
    tx: Tx,
    lease: LeaseRow,
    event: EventKind,
    target: str,
    now: int,
    source: str | None = None,
    usage: Usage | None = None,
) -> None:
    """Apply an edge that deletes the lease and settle its budget reservation, then complete a
    pending soft drain if no seat is left."""
    drain_state = free_lease(ctx, tx, lease, event, target, now, source=source)
    _settle_freed(ctx, tx, lease, event, target, now, usage, drain_state)


def _settle_freed(
    ctx: PlaneContext,
    tx: Tx,
    lease: LeaseRow,
    event: EventKind,
    target: str,
    now: int,
    usage: Usage | None,
    drain_state: str | None,
) -> None:
    """After ``lease`` was deleted: settle its budget reservation, then complete a pending soft drain
    if no seat is left (``drain_state``: as the deleting statement read it, ``None`` if it did not)."""
    settle(ctx, tx, lease, event, target, now, usage)
    if tx.shared:  # a lease unit: see the module docstring
        if drain_state is None:
            row = tx.one(SELECT_POLICY)
            drain_state = None if row is None else row.drain_state
        if drain_state != DrainState.SOFT_DRAINING_TO_1:
            return  # cannot start draining before this unit commits
        tx.execute(ADMISSION_GATE_SHARED)
        tx.execute(DRAIN_LOCK)
    complete_drain_if_settled(ctx, tx, lease.owner_instance_id, now)


def mark_starting(ctx: PlaneContext, fence: LeaseFence, now: int, request_id: str | None = None) -> None:
    """``admitted`` -> ``starting``, within the concurrent-start limit and the start interval.

    ``request_id`` (the lease's request, from its :class:`AdmittedLease`): on PostgreSQL with the session
    functions, a start with no start interval then reads nothing first. Its move, the start lock taken shared
    and the start's stamp travel with the commit, and the server checks what the unit assumed: the lease in
    ``admitted`` under its fence and request, the start window within the limit, the durable policy at the
    revision the plane last read (``PlaneContext.policy_seen``). Anything else sends the unit the
    long way below, which reads all of it first (``PlaneContext.run_sent``).
    """
    v.timestamp(now, "start timestamp")

    def work(tx: Tx) -> None:
        admitted, refusal = frozenset({S.ADMITTED}), "lease is not admitted"
        # A live revision applies at once: the policy is read in this transaction.
        window = None
        if tx.dialect.name == "postgresql":  # the lease, the policy and the start window in one statement
            found, policy_row, window = _start_reads(tx, fence.lease_id)
            lease = _phased(_fenced(found, fence), admitted, refusal)
            policy = effective_of(ctx, policy_row).policy
        else:
            lease = _in_phase(tx, fence, admitted, refusal)
            policy = effective(ctx, tx).policy
        interval = policy.min_start_interval_ms
        limit = policy.max_concurrent_starts
        shared_start = tx.shared and interval == 0 and window is not None and window <= limit
        if tx.shared and not shared_start:  # see the module docstring for the start lock
            tx.execute(START_LOCK)
        refused = _start_refusal(tx, limit, interval, now, count=not shared_start)
        if refused is not None:
            raise AdmissionStateError(refused)
        change(ctx, tx, lease, K.REQUEST_STARTING, S.STARTING, now, locked=True)  # read locked, fenced, phased
        _stamp_start(tx, fence, now, interval, shared=shared_start)

    if request_id is None:
        ctx.run(work, gate=Gate.LEASE)
        return

    def sent(tx: Tx) -> None:
        revision, policy = ctx.policy_seen
        if policy.min_start_interval_ms != 0:
            work(tx)
            return
        # The shared start of ``work`` (see the module docstring), its reads checked on the server instead.
        limit = policy.max_concurrent_starts
        move_sent(
            ctx, tx, fence_params(fence), request_id, K.REQUEST_STARTING, S.ADMITTED, S.STARTING, now,
            limit=limit, revision=revision,
        )  # fmt: skip
        _stamp_start(tx, fence, now, 0, shared=True)

    ctx.run_sent(sent, work, gate=Gate.LEASE)


def _start_refusal(tx: Tx, limit: int, interval: int, now: int, *, count: bool) -> str | None:
    """Why a start at ``now`` is refused (``mark_starting``'s message), or ``None``: the starting leases
    counted (``count``) against ``limit``, and the latest start against ``interval``."""
    if count and (tx.scalar(COUNT_STARTING_LEASES) or 0) >= limit:
        return "concurrent start limit reached"
    # With no minimum interval there is nothing to space out: a start stamped a little
    # before another connector's (clocks are read before the write lock) is not refused.
    if interval > 0:
        latest = tx.scalar(LATEST_START)
        if latest is not None and now < latest + interval:
            return "start interval has not elapsed"
    return None


def start_with_admission(ctx: PlaneContext, tx: Tx, lease: AdmittedLease, now: int) -> bool:
    """SQLite: ``admitted`` -> ``starting`` for the lease its admission just wrote, in that admission's
    transaction (``wait_for_admission(start=True)``); whether it started.

    It is :func:`mark_starting`'s long way, run where the admission left off: the lease read back under its
    fence and phase, the policy in force, the starting leases counted against the concurrent-start limit and
    the latest start against the interval. It refuses nothing: where ``mark_starting`` would refuse, the
    admission commits alone and the connector starts the lease itself. SQLite holds its write lock for the
    whole unit, so the checks are exact, as in a unit of their own; the admission's capacity check has just
    found a start slot and the interval elapsed, so the start is normally made. PostgreSQL never comes here:
    its admissions and starts take different gates (see the module docstring).
    """
    assert not tx.shared, "only a unit that serialises every writer starts in its admission"
    fence = lease.fence
    row = _in_phase(tx, fence, frozenset({S.ADMITTED}), "lease is not admitted")
    policy = effective(ctx, tx).policy
    interval = policy.min_start_interval_ms
    if _start_refusal(tx, policy.max_concurrent_starts, interval, now, count=True) is not None:
        return False
    change(ctx, tx, row, K.REQUEST_STARTING, S.STARTING, now, locked=True)  # read locked, fenced, phased
    _stamp_start(tx, fence, now, interval, shared=False)
    tx.count_neutral = False  # the unit is an admission all the same
    return True


def _stamp_start(tx: Tx, fence: LeaseFence, now: int, interval: int, *, shared: bool) -> None:
    """What a start writes after its move: the start lock shared (``shared``, see the module docstring), the
    starts older than ``interval`` pruned and this one stamped. Nothing in the unit reads them: on PostgreSQL
    they travel with the commit (``Tx.send``). Pruning after the start's reads changes nothing they saw."""
    # admitted -> starting keeps the lease in the start window, and with no interval no limit depends on when
    # a start happened: nothing admission counts changes (``Tx.count_neutral``).
    tx.count_neutral = interval == 0
    if shared:
        tx.send(SHARED_START_LOCK)
    tx.send(DELETE_OLD_STARTS, {"cutoff": now - interval})
    tx.send(INSERT_START, {"lease_id": fence.lease_id, "now": now})


def move(
    ctx: PlaneContext,
    fence: LeaseFence,
    event: EventKind,
    source: RequestState,
    target: RequestState,
    now: int,
    request_id: str | None = None,
) -> None:
    """One fenced phase change from ``source`` (refused with ``lease is not <source>`` from any other).

    ``request_id`` (the lease's request, from its :class:`AdmittedLease`): on PostgreSQL with the session
    functions the move then travels with the commit, checked on the server (``move_sent``: one round trip);
    a move the server refuses runs again the long way, which answers with the refusal.
    """
    v.timestamp(now, "activation timestamp" if target is S.ACTIVE else "lease transition timestamp")

    def work(tx: Tx) -> None:
        # PostgreSQL: the fenced move first; only when it matched nothing is the lease read, for the refusal.
        if tx.dialect.name == "postgresql" and move_unread(ctx, tx, fence_params(fence), event, source, target, now):
            return
        lease = _in_phase(tx, fence, frozenset({source}), f"lease is not {source}")
        change(ctx, tx, lease, event, target, now)

    if request_id is None:
        ctx.run(work, gate=Gate.LEASE)
        return

    def sent(tx: Tx) -> None:
        move_sent(ctx, tx, fence_params(fence), request_id, event, source, target, now)

    ctx.run_sent(sent, work, gate=Gate.LEASE)


def abandon_before_prompt(ctx: PlaneContext, fence: LeaseFence, now: int, outcome: object) -> None:
    """End a reserved turn the connector can prove never wrote its prompt (terminal, never a requeue)."""
    v.timestamp(now, "pre-prompt abandonment timestamp")
    final = abandon_outcome(outcome)

    def work(tx: Tx) -> None:
        lease = _in_phase(tx, fence, ABANDONABLE_PHASES, "lease is not safely abandonable before prompt write")
        _free_seat(ctx, tx, lease, K.REQUEST_ABANDONED, final, now)

    ctx.run(work, gate=Gate.LEASE)


def mark_execution_recovery_required(ctx: PlaneContext, fence: LeaseFence, now: int) -> None:
    """Retain an uncertain dispatch as visible capacity debt: the seat stays held, the payload is deleted."""
    v.timestamp(now, "execution recovery timestamp")

    def work(tx: Tx) -> None:
        lease = require_lease(tx, fence)
        if lease.phase == S.RECOVERY_REQUIRED:
            return
        if lease.phase not in EXECUTION_RECOVERY_PHASES:
            raise AdmissionStateError("lease cannot enter execution recovery")
        change(ctx, tx, lease, K.REQUEST_RECOVERY_REQUIRED, S.RECOVERY_REQUIRED, now)

    ctx.run(work, gate=Gate.LEASE)


def release_exited_recovery_seat(ctx: PlaneContext, fence: LeaseFence, now: int) -> None:
    """Free the seat after connector, child and process group were all proved gone (ends ``recovery_required``)."""
    v.timestamp(now, "exited recovery seat timestamp")

    def work(tx: Tx) -> None:
        lease = _in_phase(tx, fence, RELEASABLE_PHASES, "lease is not an unresolved local execution")
        _free_seat(ctx, tx, lease, K.REQUEST_RECOVERY_SEAT_RELEASED, S.RECOVERY_REQUIRED, now)

    ctx.run(work, gate=Gate.LEASE)


def settle_owner_death(ctx: PlaneContext, fence: LeaseFence, now: int) -> None:
    """Free the seat of a lease whose holder was proved gone before its dispatch intent; the turn ends.

    Before the dispatch intent no prompt can have been written, so nothing is uncertain:
    the request ends ``cancelled`` (never back in the queue) and its payload is deleted. A
    lease that moved on meanwhile is refused (its phase and fence are checked in the same
    transaction as the delete).
    """
    v.timestamp(now, "lease owner death timestamp")

    def work(tx: Tx) -> None:
        lease = _in_phase(tx, fence, OWNER_DEATH_PHASES, "lease is not before its dispatch intent")
        _free_seat(ctx, tx, lease, K.LEASE_OWNER_DEAD, OWNER_DEATH_OUTCOME, now)

    ctx.run(work, gate=Gate.LEASE)


def release_by_operator(ctx: PlaneContext, lease_id: str, now: int) -> ReleasedLease:
    """Free one lease's seat on the operator's word, where no evidence can (a host gone for good).

    The request ends as :data:`~admission_plane.states.OPERATOR_RELEASE_OUTCOMES` says for
    the lease's phase: ``cancelled`` before the dispatch intent, else ``recovery_required``
    without a seat; it is never requeued and its payload is deleted.
    """
    v.identifier(lease_id, "operator release lease ID")
    v.timestamp(now, "operator release timestamp")

    def work(tx: Tx) -> ReleasedLease:
        lease = tx.one(SELECT_LEASE_FOR_UPDATE, {"lease_id": lease_id})
        if lease is None:
            raise UnknownLeaseError()
        outcome = OPERATOR_RELEASE_OUTCOMES.get(lease.phase)
        if outcome is None:
            raise AdmissionStateError("lease is not in a seat phase")
        _free_seat(ctx, tx, lease, K.OPERATOR_SEAT_RELEASED, outcome, now)
        return ReleasedLease(S(lease.phase), outcome)

    return ctx.run(work, gate=Gate.LEASE)


def complete_live_turn(
    ctx: PlaneContext, fence: LeaseFence, now: int, completion: LiveTurnCompletion, request_id: str | None = None
) -> None:
    """Record an ``active`` turn's outcome and free its seat; a capacity failure cools its model down.

    ``request_id`` (the lease's request, from its :class:`AdmittedLease`): on PostgreSQL with the session
    functions, an outcome without a cooldown then reads nothing first. Both edges travel with the commit,
    checked on the server (``end_sent``), while this plane has reserved no budget and its last completion read
    the long way found nothing to settle (``PlaneContext.release_sent``); anything else runs the long way.
    """
    v.timestamp(now, "live turn completion timestamp")
    if not isinstance(completion, LiveTurnCompletion):
        raise InvalidInputError("live turn completion must be a LiveTurnCompletion")
    failure = completion.failure
    cooling = failure is not None and failure.category is FailureCategory.PROVIDER_CAPACITY
    outcome = completion.outcome
    moves = None
    if not cooling and outcome in LIVE_OUTCOMES:  # both edges in one statement (PostgreSQL)
        moves = (
            edge(K.REQUEST_PROVIDER_TERMINAL, S.ACTIVE, S.PROVIDER_TERMINAL),
            edge(K.REQUEST_RELEASED, S.PROVIDER_TERMINAL, outcome),
        )

    def work(tx: Tx) -> None:
        if tx.dialect.name == "postgresql" and moves is not None:
            # One statement for both edges; only when it matched nothing is the lease read, for the refusal.
            ended = end_unread(ctx, tx, fence_params(fence), moves, now)
            if ended is not None:
                freed, drain_state = ended
                ctx.release_sent = not freed.charged and drain_state != DrainState.SOFT_DRAINING_TO_1
                _settle_freed(ctx, tx, freed, K.REQUEST_RELEASED, outcome, now, completion.usage, drain_state)
                return
        lease = _in_phase(tx, fence, frozenset({S.ACTIVE}), "lease is not active")
        # Only a capacity failure needs the provider and model; the request is read for it then.
        request = tx.one(SELECT_REQUEST_META, {"request_id": lease.request_id}) if cooling else None
        if cooling and request is None:
            raise UnknownRequestError()
        change(ctx, tx, lease, K.REQUEST_PROVIDER_TERMINAL, S.PROVIDER_TERMINAL, now)
        if request is not None and failure is not None:
            tx.ring(Bell.EVERYONE)  # a cooldown can drop requests ahead of any waiter
            signal = None if failure.retry_after is None else failure.retry_after.delay_ms(now)
            not_before = now + effective(ctx, tx).policy.capacity_cooldown_for(signal)
            params = {"provider": request.provider, "model": request.model, "not_before": not_before, "now": now}
            tx.execute(UPSERT_COOLDOWN, params)
        _free_seat(ctx, tx, lease, K.REQUEST_RELEASED, outcome, now, source=S.PROVIDER_TERMINAL, usage=completion.usage)

    if request_id is None or moves is None or ctx.reservations or not ctx.release_sent:
        ctx.run(work, gate=Gate.LEASE)
        return
    both = moves

    def sent(tx: Tx) -> None:
        end_sent(ctx, tx, fence_params(fence), request_id, both, now)

    ctx.run_sent(sent, work, gate=Gate.LEASE)


def heartbeat(ctx: PlaneContext, fence: LeaseFence, now: int) -> None:
    """Refresh the lease's heartbeat and clear any suspicion; :class:`LeaseFenceError` if not owned."""
    v.timestamp(now, "heartbeat timestamp")

    def work(tx: Tx) -> None:
        if tx.execute(HEARTBEAT, {**fence_params(fence), "now": now}) != 1:
            raise LeaseFenceError()

    ctx.run(work, gate=Gate.LEASE)


def mark_suspect(ctx: PlaneContext, fence: LeaseFence, now: int, reason: SuspectReason | str) -> bool:
    """Mark a lease suspect (keeps the first ``suspect_since``); ``False`` if the fence matches nothing."""
    v.timestamp(now, "lease suspect timestamp")
    try:
        reason = SuspectReason(reason)
    except ValueError:
        raise InvalidInputError("lease suspect reason is invalid") from None
    params = {**fence_params(fence), "now": now, "reason": str(reason)}
    return ctx.run(lambda tx: tx.execute(MARK_SUSPECT, params) == 1, gate=Gate.LEASE)


def set_capacity_cooldown(ctx: PlaneContext, provider: str, model: str, not_before: int, now: int) -> None:
    """Hold back ``provider``/``model`` until ``not_before``; a cooldown is never shortened."""
    if not v.is_safe_integer(not_before) or not v.is_safe_integer(now) or not_before < now:
        raise InvalidInputError("capacity cooldown must use integer timestamps and cannot end before it is recorded")
    v.timestamp(now, "capacity cooldown timestamp")  # and so not_before, which is not earlier
    v.request_field("provider", provider)  # the rules of the requests it holds back
    v.request_field("model", model)
    params = {"provider": provider, "model": model, "not_before": not_before, "now": now}

    def work(tx: Tx) -> None:
        tx.execute(UPSERT_COOLDOWN, params)
        tx.ring(Bell.EVERYONE)  # a cooldown can drop requests ahead of any waiter

    ctx.run(work)
