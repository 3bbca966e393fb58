"""Admission: which request gets the next seat, and what a waiting connector waits for.

In order: time out expired requests; refuse while global capacity is full (seats,
concurrent starts, the minimum start interval and the recent-reservation rule); then
admit the rule's choice (:mod:`admission_plane.service._selection`: lanes, fair share,
keyed and per-session limits, cooldowns and pauses). The admission transaction applies
it; a waiter's *look* reads the same facts without the write lock and says what could
change the answer (:class:`Wake`).

PostgreSQL, under a simple policy (no keyed or session limit, no budget, no start interval): an
admission of one request reads nothing first. Its unit is sent whole with its commit, and the server
decides it under the admission gate (``pg_temp.admission_plane_blind_admissible``, in
:mod:`admission_plane.store.session_functions`), exactly as :func:`admit_in_transaction` would for the
cases the rule decides from the idle agents ahead alone; it refuses every other case, and the admission
then takes the long way (:func:`_admit`). Why the server's answer is the rule's: the function's docstring
lists what it requires and what it counts, each the condition of :func:`parallel_choice` and
:func:`~admission_plane.service._selection.rank_among_idle` it stands for, and
``tests/admission/database/test_blind_admission.py`` compares both on random states.
"""

from __future__ import annotations

import enum
import uuid

import attrs

from .. import _validate as v
from ..errors import AdmissionRuntimeError
from ..states import EventKind, RequestState
from ..store.rows import CooldownRow, EntryRow, KeyHeadRow, MemberHeadRow, PauseRow, PolicyRow, SeatRow
from ..store.statements.admission import (
    ADMISSION_READS,
    ANY_EXPIRED,
    SELECT_CANDIDATE,
    SELECT_EXPIRED,
)
from ..store.statements.requests import SELECT_REQUEST_STATUS
from ..store.tx import Returned, Tx
from ..store.unit_of_work import Gate, SentUnitRefused
from ..values import AdmittedLease
from . import _budgets, _policy
from ._context import PlaneContext
from ._enqueue import record_admitting_owner
from ._lifecycle import start_with_admission
from ._selection import (
    RANK_HORIZON,
    Choice,
    Facts,
    KeyBlock,
    Keys,
    Limits,
    choose,
    idle_agents_ahead,
    key_block,
    keys_of,
    limits_of,
    rank_among_idle,
    read_keys,
    session_full,
    spend_credits,
)
from ._transitions import NewLease, QueuedRequest, admit_at_once, admit_sent, change
from ._wake import Wake

S = RequestState


class Verdict(enum.Enum):
    """A look's answer when waiting is over."""

    WRITE = "an admission attempt may succeed now"


@attrs.frozen
class SentLease:
    """An admission whose reservation its commit carried: the lease, once that commit has returned its generation."""

    lease_id: str
    request_id: str
    owner_instance_id: str
    generation: Returned

    def lease(self) -> AdmittedLease:
        lease = self.lease_if_admitted()
        if lease is None:  # the server's check refuses the commit first
            raise AdmissionRuntimeError("an admission committed without its lease's generation")
        return lease

    def lease_if_admitted(self) -> AdmittedLease | None:
        """The lease, or ``None`` when the server admitted nothing (an admission tried without a check)."""
        row = self.generation.row
        if row is None or row[0] is None:
            return None
        return AdmittedLease(self.lease_id, self.request_id, int(row[0]), self.owner_instance_id)


def blind_applies(ctx: PlaneContext, owner_instance_id: str, parallel: bool) -> dict[str, object] | None:
    """The parameters of an admission sent whole with its commit (``SENT_BLIND_ADMIT``: it reads nothing first,
    one round trip), or ``None`` when the server could not decide it: the policy this plane last read
    (``PlaneContext.policy_seen``, which the server checks) sets a keyed or session limit, a budget or a start
    interval, or this plane's connector identity is still to be recorded (:func:`record_admitting_owner` reads)."""
    revision, policy = ctx.policy_seen
    if policy.min_start_interval_ms or not limits_of(policy).simple:
        return None
    if not ctx.owner_recorded and owner_instance_id == ctx.owner_identity.owner_instance_id:
        return None
    return {
        "revision": revision,
        "default_seats": ctx.policy.max_active_turns,
        "max_starts": policy.max_concurrent_starts,
        "parallel": parallel,
        "horizon": RANK_HORIZON,
    }


def _admit(
    ctx: PlaneContext,
    now: int,
    owner_instance_id: str,
    only: str | None,
    parallel: bool,
    *,
    long_way: bool = True,
    whole: bool = True,
    start: bool = False,
) -> AdmittedLease | None:
    """One admission unit: :func:`admit_in_transaction`, its reservation sent with its commit where it can be
    (PostgreSQL with the session functions; ``PlaneContext.run_sent``).

    For one request under a simple policy (:func:`blind_applies`) the unit reads nothing: the server decides and
    reserves in the commit's round trip, so the admission gate is held for the server's work alone, never across
    a round trip or the connector's own CPU. If the server refuses (the rule does not admit the request now, or
    the case is not one it decides), nothing was committed: the admission takes the long way (reading first),
    unless ``long_way`` is false (a waiter's first attempt, which then looks without the gate). Without ``whole``
    the admission takes the long way at once (the server has just refused it). ``start``: as for
    :func:`admit_in_transaction`.
    """

    def sent(tx: Tx) -> AdmittedLease | SentLease | None:
        return admit_in_transaction(ctx, tx, now, owner_instance_id, only, parallel=parallel, sent=True)

    def work(tx: Tx) -> AdmittedLease | SentLease | None:
        return admit_in_transaction(ctx, tx, now, owner_instance_id, only, parallel=parallel, start=start)

    blind = None if only is None or not whole else blind_applies(ctx, owner_instance_id, parallel)
    if blind is not None and only is not None:
        request_id = only

        def sent_blind(tx: Tx) -> AdmittedLease | SentLease | None:
            if not tx.functions:
                return work(tx)
            lease_id = str(uuid.uuid4())
            returned = admit_sent(
                ctx, tx, lease_id, request_id, owner_instance_id, EventKind.REQUEST_ADMITTED, now, blind=blind
            )
            return SentLease(lease_id, request_id, owner_instance_id, returned)

        try:
            return _leased(ctx.run(sent_blind, gate=Gate.ADMISSION))
        except SentUnitRefused:
            if not long_way:
                return None
    return _leased(ctx.run_sent(sent, work, gate=Gate.ADMISSION))


def _leased(admitted: AdmittedLease | SentLease | None) -> AdmittedLease | None:
    return admitted.lease() if isinstance(admitted, SentLease) else admitted


def admit_next(ctx: PlaneContext, now: int, owner_instance_id: str) -> AdmittedLease | None:
    """Admit the rule's choice, or ``None`` when nothing may start now."""
    v.identifier(owner_instance_id, "admission owner instance ID")
    v.timestamp(now, "admission timestamp")
    return _admit(ctx, now, owner_instance_id, None, False)


def admit_request(
    ctx: PlaneContext,
    request_id: str,
    now: int,
    owner_instance_id: str,
    *,
    plan_wait: bool = True,
    direct: bool = False,
    parallel: bool = False,
    start: bool = False,
) -> tuple[AdmittedLease | None, Wake | None]:
    """Admit ``request_id`` only if the rule would choose exactly it now; else what to wait for.

    The wake is ``None`` when the request is no longer queued (nothing to wait for).
    Without ``plan_wait`` the look stops as soon as it knows the answer is "not now", and
    the returned wake is a plain "look again". With ``direct`` it tries the admission first
    and looks only if that admitted nothing (a waiter's first attempt on PostgreSQL, where the
    look's statements are round trips and a request just queued is often admitted at once).
    With ``parallel`` (a waiter) it may be admitted beside the rule's first choices
    (:func:`parallel_choice`). With ``start`` the admission may start the lease in its own transaction
    (:func:`admit_in_transaction`).
    """
    v.identifier(request_id, "admission request ID")
    v.identifier(owner_instance_id, "admission owner instance ID")
    v.timestamp(now, "admission timestamp")

    def attempt(long_way: bool = True, whole: bool = True) -> AdmittedLease | None:
        return _admit(ctx, now, owner_instance_id, request_id, parallel, long_way=long_way, whole=whole, start=start)

    if direct:
        lease = attempt(long_way=False)  # if the server refused it, the look below says what to do
        if lease is not None:
            return lease, None
    # A read-only look first: with nothing to time out and ``request_id`` not the one the
    # rule would admit now, the attempt is a no-op, so waiting connectors look without
    # taking the write lock. The writing transaction re-checks everything, so the look
    # is only an optimisation, never a decision.
    wake = ctx.run(lambda tx: look(ctx, tx, request_id, now, plan_wait, parallel=parallel), read_only=True)
    if not isinstance(wake, Verdict):
        return None, wake
    lease = attempt(whole=not direct)  # a first attempt not admitted: the long way, which times requests out
    # Lost a race (or something timed out meanwhile): look again after one short step.
    return lease, None if lease is not None else Wake(at=now)


def admit_in_transaction(
    ctx: PlaneContext,
    tx: Tx,
    now: int,
    owner_instance_id: str,
    only_request_id: str | None,
    *,
    parallel: bool = False,
    sent: bool = False,
    refused: list[Wake | Verdict | None] | None = None,
    start: bool = False,
) -> AdmittedLease | SentLease | None:
    """Time out expired requests, then admit the rule's choice (only if it is ``only_request_id``, when given).

    With ``parallel`` (a waiter's attempt), ``only_request_id`` is admitted also when it is not the
    rule's first choice but one of the next ones and every request before it still finds a seat
    and a start slot (:func:`parallel_choice`). With ``sent`` (PostgreSQL with the session functions)
    the reservation travels with the commit (``admit_sent``) and the lease is known once it returned.
    With ``refused`` (a list) and ``only_request_id``, an admission that admits nothing appends what a
    waiter's :func:`look` would answer now, from the same reads (see :func:`_waiting.WaitHint`).
    With ``start`` on SQLite, the admitted lease is also moved to ``starting`` in this transaction where
    ``mark_starting`` would allow it (:func:`~admission_plane.service._lifecycle.start_with_admission`); the
    returned lease says so (``AdmittedLease.starting``). It saves a waiter one writing unit (and one durable
    commit) under the write lock every other writer waits for. PostgreSQL ignores it.
    """
    reads = read_state(ctx, tx, now, expire=True, request_id=only_request_id)
    assert reads is not None, "expire=True times out what expired"
    policy, facts, keys = reads
    choice = _admitted_choice(tx, policy, facts, keys, now, only_request_id, parallel)
    if choice is None:
        if refused is not None and only_request_id is not None:
            refused.append(_answer(tx, only_request_id, now, policy, facts, keys, True, parallel))
        return None
    lease_id, request_id = str(uuid.uuid4()), choice.request_id
    returned = None
    if tx.functions and sent:  # PostgreSQL: the reservation in one statement, with the commit
        returned = admit_sent(ctx, tx, lease_id, request_id, owner_instance_id, EventKind.REQUEST_ADMITTED, now)
        generation = 0
    elif tx.functions:  # PostgreSQL: the reservation in one statement
        reserved = admit_at_once(ctx, tx, lease_id, request_id, owner_instance_id, EventKind.REQUEST_ADMITTED, now)
        if reserved is None:
            return None
        generation = reserved
    else:
        candidate = tx.one(SELECT_CANDIDATE, {"request_id": request_id})
        if candidate is None:
            return None
        generation = candidate.lease_generation + 1
        lease = NewLease(lease_id, request_id, generation, owner_instance_id)
        change(ctx, tx, lease, EventKind.REQUEST_ADMITTED, S.ADMITTED, now)
    spend_credits(tx, choice)
    if facts.book is not None:
        _budgets.reserve(ctx, facts.book, request_id, *choice.key, now)
    record_admitting_owner(ctx, tx, owner_instance_id, now)
    if returned is not None:
        return SentLease(lease_id, request_id, owner_instance_id, returned)
    admitted = AdmittedLease(lease_id, request_id, generation, owner_instance_id)
    if start and not tx.functions and tx.dialect.name == "sqlite" and start_with_admission(ctx, tx, admitted, now):
        return attrs.evolve(admitted, starting=True)
    return admitted


def _admitted_choice(
    tx: Tx,
    policy: _policy.Effective,
    facts: Facts,
    keys: Keys,
    now: int,
    only_request_id: str | None,
    parallel: bool,
) -> Choice | None:
    """The request :func:`admit_in_transaction` admits from its reads, or ``None``."""
    if capacity_block(tx, policy, facts, now) is not None:
        return None
    limits = limits_of(policy.policy)
    choice = choose(tx, limits, facts, keys)
    if choice is not None and only_request_id is not None and choice.request_id != only_request_id:
        if not parallel:
            return None
        entry = facts.entry_of(tx, only_request_id)
        return parallel_choice(tx, policy, limits, facts, keys, only_request_id, entry)
    return choice


def parallel_choice(
    tx: Tx, policy: _policy.Effective, limits: Limits, facts: Facts, keys: Keys, request_id: str, entry: EntryRow | None
) -> Choice | None:
    """``request_id`` as the choice, if it may be admitted beside the rule's first choices: it is the
    rule's (n+1)-th (:func:`~admission_plane.service._selection.rank_among_idle`) and there are at
    least n+1 free seats and start slots, with no start interval to space them (beyond the seed).

    Why no request loses by it: the n requests before it are the heads of n idle agents, and
    admitting it first changes neither who they are nor their order (its agent was idle and
    behind them; now it holds a seat); n seats and start slots stay free for them. Their
    connectors admit them as they look, each in its own transaction, instead of one after the
    other behind each other's notifications. ``entry`` is the request's place in the admission
    index (``None``: it has none, so it is not admissible).
    """
    if policy.seat_limit is None or policy.policy.min_start_interval_ms > 0 or entry is None:
        return None
    free = min(policy.seat_limit - facts.seats, policy.policy.max_concurrent_starts - facts.starts)
    # Not the rule's first choice, so at least one request is ahead: room for two at the least.
    if free < 2 or key_block(limits, facts, entry.provider, entry.model) is not None:
        return None
    rank = rank_among_idle(tx, limits, facts, keys, entry.lane, entry.agent_id, (entry.enqueued_at, request_id))
    if rank is None or free < rank + 1:
        return None
    return Choice(request_id, entry.lane, (entry.provider, entry.model))


def look(
    ctx: PlaneContext, tx: Tx, request_id: str, now: int, plan_wait: bool = True, *, parallel: bool = False
) -> Wake | Verdict | None:
    """``Verdict.WRITE`` if an admission attempt may succeed now; else what could change that
    (``None``: the request is not queued any more). ``parallel``: as for :func:`admit_in_transaction`."""
    reads = read_state(ctx, tx, now, expire=False, request_id=request_id)
    if reads is None:
        return Verdict.WRITE  # a request to time out: only a writing transaction can
    return _answer(tx, request_id, now, *reads, plan_wait, parallel)


def _answer(
    tx: Tx,
    request_id: str,
    now: int,
    policy: _policy.Effective,
    facts: Facts,
    keys: Keys,
    plan_wait: bool,
    parallel: bool,
) -> Wake | Verdict | None:
    """:func:`look`'s answer from reads already made (``read_state``)."""
    limits = limits_of(policy.policy)
    choice = choose(tx, limits, facts, keys)
    if choice is not None and choice.request_id == request_id:
        block = capacity_block(tx, policy, facts, now, plan_wait=plan_wait)
        return Verdict.WRITE if block is None else attrs.evolve(block, first=True)
    if not (plan_wait or parallel):
        return Wake()
    entry = facts.entry_of(tx, request_id)  # read once (on PostgreSQL with the facts), for both uses below
    beside = parallel and choice is not None and capacity_block(tx, policy, facts, now) is None
    if beside and parallel_choice(tx, policy, limits, facts, keys, request_id, entry) is not None:
        return Verdict.WRITE
    if not plan_wait:
        return Wake()
    if entry is None:
        status = tx.one(SELECT_REQUEST_STATUS, {"request_id": request_id})
        # Queued without a payload: only ``persist_payload`` (or the fallback) helps.
        return Wake() if status is not None and status.state == S.QUEUED else None
    if facts.paused_all or entry.lane in facts.paused_lanes:
        return Wake()  # a resume rings for everyone
    key = key_block(limits, facts, entry.provider, entry.model)
    if key is KeyBlock.COOLING:
        return Wake(at=facts.cooling[(entry.provider, entry.model)])
    if key is KeyBlock.PAUSED:
        return Wake()
    if key is KeyBlock.FULL:
        return Wake(queue=1, seats=True, starts=True)
    if key is KeyBlock.BUDGET:
        # The windows free by their own clock; a settled turn (a freed seat) may refund or lower its tokens.
        assert facts.book is not None
        # The key's best request's tokens, or (a request budget spent) at least this request's own.
        tokens = facts.book.blocked.get((entry.provider, entry.model), facts.book.estimate(request_id))
        return Wake(queue=1, seats=True, at=facts.book.free_at(entry.provider, entry.model, tokens))
    if session_full(limits, facts, entry.session_id) or facts.agent_seats[entry.agent_id]:
        # Picked once a seat of ours is freed, or once the requests ahead of ours have left.
        return Wake(queue=1, seats=True)
    ahead = idle_agents_ahead(tx, limits, facts, keys.get(entry.lane, []), (entry.enqueued_at, request_id))
    return Wake(queue=max(1, ahead or 0))


def read_state(
    ctx: PlaneContext, tx: Tx, now: int, *, expire: bool, request_id: str | None = None
) -> tuple[_policy.Effective, Facts, Keys] | None:
    """The policy in force, the rule's facts and the lanes' keys, after the queued requests past their
    deadline are timed out (``expire``), or ``None`` if there are any (not ``expire``: a look).

    PostgreSQL reads them in one statement (:data:`~admission_plane.store.statements.admission.ADMISSION_READS`,
    one round trip instead of seven, inside the admission's lock), with the admission-index entry of
    ``request_id`` (:meth:`Facts.entry_of`); SQLite, in process, one statement each.
    """
    if tx.dialect.name != "postgresql":
        if expire:
            expire_queued(ctx, tx, now)
        elif tx.exists(ANY_EXPIRED, {"now": now}):
            return None
        policy = _policy.effective(ctx, tx)
        return policy, Facts.read(tx, now, policy.policy), read_keys(tx)
    row = tx.row(ADMISSION_READS, {"now": now, "request_id": request_id})
    assert row is not None, "a SELECT without FROM returns one row"
    expired, latest_start, policy_row, seats, cooldowns, pauses, keys, first_agents, entry = row
    if expired:
        if not expire:
            return None
        expire_queued(ctx, tx, now)
        return read_state(ctx, tx, now, expire=False, request_id=request_id)  # none is left to expire at ``now``
    policy = _policy.effective_of(ctx, None if policy_row is None else PolicyRow.from_row(policy_row))
    facts = Facts.of(
        tx,
        now,
        policy.policy,
        map(SeatRow.from_row, seats),
        map(CooldownRow.from_row, cooldowns),
        map(PauseRow.from_row, pauses),
    )
    facts.latest_start, facts.latest_start_read = latest_start, True
    for lane, provider, model, *head in first_agents:
        facts.first_agents.setdefault((lane, provider, model), []).append(MemberHeadRow.from_row(head))
    if request_id is not None:
        facts.entries[request_id] = None if entry is None else EntryRow.from_row(entry)
    return policy, facts, keys_of(map(KeyHeadRow.from_row, keys))


def expire_queued(ctx: PlaneContext, tx: Tx, now: int) -> None:
    """Time out every queued request past its deadline (each one a departure from the queue)."""
    for request_id in tx.column(SELECT_EXPIRED, {"now": now}):
        change(ctx, tx, QueuedRequest(request_id), EventKind.REQUEST_QUEUE_TIMED_OUT, S.QUEUE_TIMEOUT, now)


def capacity_block(
    tx: Tx, policy: _policy.Effective, facts: Facts, now: int, *, plan_wait: bool = False
) -> Wake | None:
    """``None`` if a seat may be taken now; else what could free one.

    Only with ``plan_wait`` does it look up when the start interval ends (a statement the
    admission transaction itself has no use for).
    """
    # ``queue=1`` too: while capacity is full a departure is rare (a cancellation, a
    # time-out), and it may be this very request, which ends the wait. A drain in progress
    # completes when the last seat is freed.
    if policy.seat_limit is None or facts.seats >= policy.seat_limit:
        return Wake(queue=1, seats=True)
    if facts.starts >= policy.policy.max_concurrent_starts:
        return Wake(queue=1, starts=True)
    interval = policy.policy.min_start_interval_ms
    if interval == 0:
        # Nothing to space out (as ``mark_starting`` says too): a start or reservation stamped after this
        # caller's ``now`` (its clock was read before it waited for the lock) holds nothing back.
        return None
    cutoff = now - interval
    reserved = facts.latest_reservation is not None and facts.latest_reservation > cutoff
    if not reserved:
        latest_start = facts.latest_start_of(tx)
        if latest_start is None or latest_start <= cutoff:
            return None
    if not plan_wait:
        return Wake(queue=1, starts=True)
    latest = max(facts.latest_start_of(tx) or 0, facts.latest_reservation or 0)
    return Wake(queue=1, starts=True, at=max(now + 1, latest + interval))
