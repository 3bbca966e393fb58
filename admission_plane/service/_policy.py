"""The durable policy shared by every opener of a plane: the original's claim and soft drain from
3 seats to 1, and (policy v2) live revisions that every connector applies at its next transaction.

Which policy is in force (:func:`effective`): a live revision once one was set (the whole
policy, v2 parts included); before that, the original's rule: the claimed durable row
decides the seat count, the plane's own :class:`~admission_plane.Policy` the rest.
"""

from __future__ import annotations

import functools
import json

import attrs

from .. import _validate as v
from ..crypto import policy_fingerprint
from ..errors import AdmissionRuntimeError, InvalidInputError
from ..policy import SEED_FIELDS, Policy
from ..states import POLICY_EVENT_ID, DrainState, EventKind
from ..store.doorbell import Bell
from ..store.rows import PolicyRow
from ..store.statements.admission import COUNT_SEAT_LEASES
from ..store.statements.policy import (
    APPLY_REVISION,
    INSERT_POLICY_IF_ABSENT,
    INSERT_REVISED_POLICY,
    INSERT_REVISION,
    LATEST_REVISION,
    SELECT_POLICY,
    SELECT_REVISIONS,
    START_DRAIN,
)
from ..store.tx import Tx
from ..values import PolicyRevision
from . import _journal
from ._context import PlaneContext
from ._transitions import DrainCompletion, change

#: The only drain the original knows: from a steady three-seat policy to one seat.
DRAIN_FROM_SEATS = 3


def claim(ctx: PlaneContext, policy: Policy, owner_instance_id: str, now: int) -> None:
    """Record ``policy`` as the plane's shared policy, or check that the recorded one matches it."""
    fingerprint_hex = _checked_fingerprint(ctx, policy, owner_instance_id, now)
    policy.check_durable()

    def work(tx: Tx) -> None:
        params = {
            **attrs.asdict(policy),
            "policy_fingerprint": fingerprint_hex,
            "now": now,
            "owner_instance_id": owner_instance_id,
        }
        if tx.execute(INSERT_POLICY_IF_ABSENT, params) == 1:
            tx.ring(Bell.EVERYONE)  # the seat count may have changed
            return
        _assert_matches(tx, policy, fingerprint_hex)

    ctx.run(work)


def assert_match(ctx: PlaneContext, policy: Policy, owner_instance_id: str, now: int) -> None:
    """Raise :class:`AdmissionRuntimeError` unless the durable policy equals ``policy``."""
    fingerprint_hex = _checked_fingerprint(ctx, policy, owner_instance_id, now)
    ctx.run(lambda tx: _assert_matches(tx, policy, fingerprint_hex), read_only=True)


def begin_soft_drain(ctx: PlaneContext, owner_instance_id: str, now: int) -> None:
    """Start draining a steady three-seat policy to one seat (completes when no seat is held)."""
    v.identifier(owner_instance_id, "soft drain owner instance ID")
    v.timestamp(now, "soft drain timestamp")

    def work(tx: Tx) -> None:
        row = tx.one(SELECT_POLICY)
        if row is None:
            raise AdmissionRuntimeError("durable policy has not been claimed")
        drain_state = drain_state_of(row)
        max_active = _integer(row.max_active_turns, "durable policy max_active_turns")
        if drain_state is DrainState.STEADY and max_active == 1:
            return
        if max_active != DRAIN_FROM_SEATS and drain_state is not DrainState.SOFT_DRAINING_TO_1:
            raise AdmissionRuntimeError("soft drain can only start from a steady three-seat policy")
        if drain_state is DrainState.STEADY and tx.execute(START_DRAIN, {"now": now, "owner": owner_instance_id}) != 1:
            raise AdmissionRuntimeError("soft drain could not be started atomically")
        tx.ring(Bell.EVERYONE)
        complete_drain_if_settled(ctx, tx, owner_instance_id, now)

    ctx.run(work)


def complete_drain_if_settled(ctx: PlaneContext, tx: Tx, owner_instance_id: str, now: int) -> None:
    """Finish a pending soft drain once no seat is held (called wherever a seat is freed)."""
    row = tx.one(SELECT_POLICY)
    if row is None or drain_state_of(row) is not DrainState.SOFT_DRAINING_TO_1:
        return
    if tx.scalar(COUNT_SEAT_LEASES) != 0:
        return
    settled = durable_policy(Policy(), row, max_active_turns=1)
    values = {
        "max_concurrent_starts": settled.max_concurrent_starts,
        "min_start_interval_ms": settled.min_start_interval_ms,
        "queue_timeout_ms": settled.queue_timeout_ms,
        "capacity_cooldown_ms": settled.capacity_cooldown_ms,
        "policy_fingerprint": policy_fingerprint(ctx.keys.require_content(), settled.as_tuple()),
        "now": now,
        "owner": owner_instance_id,
    }
    change(ctx, tx, DrainCompletion(values), EventKind.POLICY_DRAIN_COMPLETED, DrainState.STEADY.journal_token, now)


def seat_limit(ctx: PlaneContext, row: PolicyRow | None) -> int | None:
    """How many seats admission may fill: the durable policy's, else this plane's; ``None`` while draining."""
    if row is None:
        return ctx.policy.max_active_turns
    if drain_state_of(row) is DrainState.SOFT_DRAINING_TO_1:
        return None
    return _integer(row.max_active_turns, "durable policy max_active_turns")


def drain_state_of(row: PolicyRow) -> DrainState:
    """The row's drain state; :class:`AdmissionRuntimeError` if it is not one."""
    try:
        return DrainState(row.drain_state)
    except ValueError:
        raise AdmissionRuntimeError("durable policy drain state is invalid") from None


def _checked_fingerprint(ctx: PlaneContext, policy: Policy, owner_instance_id: str, now: int) -> str:
    if not isinstance(policy, Policy):
        raise InvalidInputError("policy must be an admission_plane.Policy")
    v.identifier(owner_instance_id, "durable policy owner instance ID")
    v.timestamp(now, "durable policy timestamp")
    return policy_fingerprint(ctx.keys.require_content(), policy.as_tuple())


def _assert_matches(tx: Tx, policy: Policy, fingerprint_hex: str) -> None:
    row = tx.one(SELECT_POLICY)
    if row is None:
        raise AdmissionRuntimeError("durable policy has not been claimed")
    stored = (
        row.max_active_turns,
        row.max_concurrent_starts,
        row.min_start_interval_ms,
        row.queue_timeout_ms,
        row.capacity_cooldown_ms,
    )
    if stored != policy.as_tuple() or row.policy_fingerprint != fingerprint_hex:
        raise AdmissionRuntimeError("durable policy does not match shared runtime policy")
    if row.revision and (not isinstance(row.document, str) or revised_policy(row) != policy):
        raise AdmissionRuntimeError("durable policy does not match shared runtime policy")


def _integer(value: object, label: str) -> int:
    if not v.is_safe_integer(value) or value < 0:
        raise AdmissionRuntimeError(f"{label} is invalid")
    return value


# --- policy v2: the policy in force and its live revisions -----------------------------------------

#: The most revisions :func:`history` returns at once.
MAX_HISTORY = 1000


@attrs.frozen
class Effective:
    """The policy in force for one transaction.

    ``seat_limit`` is ``None`` while a soft drain is in progress (nothing is admitted).
    """

    policy: Policy
    seat_limit: int | None
    revision: int


def effective(ctx: PlaneContext, tx: Tx) -> Effective:
    """The policy in force, read in ``tx`` (one statement; a revision's document is parsed once)."""
    return effective_of(ctx, tx.one(SELECT_POLICY))


def effective_of(ctx: PlaneContext, row: PolicyRow | None) -> Effective:
    """The policy in force, given the durable policy row (``SELECT_POLICY``; ``None``: not claimed). Remembered
    with its revision as the plane's latest read (``PlaneContext.policy_seen``)."""
    in_force = _effective_of(ctx, row)
    ctx.policy_seen = (in_force.revision, in_force.policy)
    return in_force


def _effective_of(ctx: PlaneContext, row: PolicyRow | None) -> Effective:
    if row is None:
        return Effective(ctx.policy, ctx.policy.max_active_turns, 0)
    seats = seat_limit(ctx, row)
    revision = row.revision
    if revision:
        if not isinstance(row.document, str):
            raise AdmissionRuntimeError("durable policy revision is missing")
        return Effective(revised_policy(row), seats, _integer(revision, "durable policy revision"))
    return Effective(ctx.policy, seats, 0)


def revised_policy(row: PolicyRow) -> Policy:
    """The revision in force, with the row's seat count: a soft drain completed since the revision was set
    changed the seats (3 to 1) in the row only."""
    policy = parse_document(row.document)
    seats = _integer(row.max_active_turns, "durable policy max_active_turns")
    if seats == policy.max_active_turns:
        return policy
    try:
        return attrs.evolve(policy, max_active_turns=seats)
    except InvalidInputError as error:
        raise AdmissionRuntimeError(str(error)) from None


@functools.lru_cache(maxsize=64)
def parse_document(document: str) -> Policy:
    """A revision's policy; :class:`AdmissionRuntimeError` if the stored document is not one."""
    try:
        return Policy.from_json(document)
    except InvalidInputError as error:
        raise AdmissionRuntimeError(f"durable policy revision is invalid: {error}") from None


def set_policy(ctx: PlaneContext, policy: Policy, now: int) -> PolicyRevision:
    """Put ``policy`` in force as the next revision, for every connector at its next transaction.

    Running turns are never preempted: a lowered limit holds back admission until it holds.
    A soft drain in progress ends (the revision says how many seats there are).
    """
    if not isinstance(policy, Policy):
        raise InvalidInputError("policy must be an admission_plane.Policy")
    v.timestamp(now, "policy revision timestamp")
    policy.check_durable()
    fingerprint_hex = policy_fingerprint(ctx.keys.require_content(), policy.as_tuple())
    document = json.dumps(policy.to_json(), sort_keys=True, separators=(",", ":"))

    def work(tx: Tx) -> PolicyRevision:
        revision = (tx.scalar(LATEST_REVISION) or 0) + 1
        tx.execute(INSERT_REVISION, {"revision": revision, "now": now, "document": document})
        row = tx.one(SELECT_POLICY)
        params = {
            **{name: getattr(policy, name) for name in SEED_FIELDS},
            "policy_fingerprint": fingerprint_hex,
            "now": now,
            "owner_instance_id": ctx.owner_identity.owner_instance_id,
            "revision": revision,
        }
        tx.execute(INSERT_REVISED_POLICY if row is None else APPLY_REVISION, params)
        source = DrainState.STEADY if row is None else drain_state_of(row)
        target = DrainState.STEADY.journal_token
        _journal.record(ctx, tx, EventKind.POLICY_REVISED, POLICY_EVENT_ID, source.journal_token, target, now)
        tx.ring(Bell.EVERYONE)  # a raised limit may admit anyone
        return PolicyRevision(revision, now, policy)

    return ctx.run(work)


def current(ctx: PlaneContext) -> PolicyRevision:
    """The policy in force (revision 0: none set yet; then the durable seats and this plane's policy)."""

    def work(tx: Tx) -> PolicyRevision:
        row = tx.one(SELECT_POLICY)
        if row is None:
            return PolicyRevision(0, 0, ctx.policy)
        if not row.revision:
            return PolicyRevision(0, 0, durable_policy(ctx.policy, row))
        newest = tx.all(SELECT_REVISIONS, {"limit": 1})  # a revision is put in force when it is written
        created = newest[0].created_at if newest and newest[0].revision == row.revision else 0
        return PolicyRevision(_integer(row.revision, "durable policy revision"), created, revised_policy(row))

    return ctx.run(work, read_only=True)


def history(ctx: PlaneContext, limit: int) -> tuple[PolicyRevision, ...]:
    """The newest ``limit`` revisions, newest first."""
    v.positive_integer(limit, "policy history limit", MAX_HISTORY)
    rows = ctx.run(lambda tx: tx.all(SELECT_REVISIONS, {"limit": limit}), read_only=True)
    return tuple(PolicyRevision(row.revision, row.created_at, parse_document(row.document)) for row in rows)


def durable_policy(base: Policy, row: PolicyRow, *, max_active_turns: int | None = None) -> Policy:
    """``base`` with the durable row's five original fields (the seats replaced by ``max_active_turns``
    when given); checked, so a row holding what no policy may hold raises :class:`AdmissionRuntimeError`."""
    seats, starts, interval, timeout, cooldown = (
        _integer(getattr(row, name), f"durable policy {name}") for name in SEED_FIELDS
    )
    try:
        return attrs.evolve(
            base,
            max_active_turns=seats if max_active_turns is None else max_active_turns,
            max_concurrent_starts=starts,
            min_start_interval_ms=interval,
            queue_timeout_ms=timeout,
            capacity_cooldown_ms=cooldown,
        )
    except InvalidInputError as error:
        raise AdmissionRuntimeError(str(error)) from None
