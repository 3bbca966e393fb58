"""The durable policy shared by every opener of a plane, and the original's soft drain from 3 seats to 1."""

from __future__ import annotations

import attrs

from .. import _validate as v
from ..crypto import policy_fingerprint
from ..errors import AdmissionRuntimeError, InvalidInputError
from ..policy import Policy
from ..states import DrainState, EventKind
from ..store.doorbell import Bell
from ..store.rows import PolicyRow
from ..store.statements.admission import COUNT_SEAT_LEASES
from ..store.statements.policy import INSERT_POLICY_IF_ABSENT, SELECT_POLICY, START_DRAIN
from ..store.tx import Tx
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
    try:
        settled = Policy(
            1,
            _integer(row.max_concurrent_starts, "durable policy max_concurrent_starts"),
            _integer(row.min_start_interval_ms, "durable policy min_start_interval_ms"),
            _integer(row.queue_timeout_ms, "durable policy queue_timeout_ms"),
            _integer(row.capacity_cooldown_ms, "durable policy capacity_cooldown_ms"),
        )
    except InvalidInputError as error:
        raise AdmissionRuntimeError(str(error)) from None
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


def _integer(value: object, label: str) -> int:
    if not v.is_safe_integer(value) or value < 0:
        raise AdmissionRuntimeError(f"{label} is invalid")
    return value
