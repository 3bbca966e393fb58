"""A read-only picture of a live plane for operators (``admission-plane status``) and the demo.

One deferred (read-only) transaction, so the numbers are consistent with each other.
It reads states, counts, times and the cooldowns' provider/model names; never an agent,
session, request id or payload.

Budget windows are not read here: their rules (what counts in a sliding window, how a
reservation settles) live in the service, above the store. The caller adds them from
:meth:`AdmissionPlane.budget_status <admission_plane.AdmissionPlane.budget_status>`
(``admission-plane status`` does), in a read of its own at the same ``now``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import Engine, case, func, select

from ..states import SEAT_PHASES, RequestState
from .engine import deferred
from .model import (
    AdmissionPause,
    Cooldown,
    Event,
    Lease,
    PolicyRevision,
    PolicyState,
    QueueEntry,
    TurnPayload,
    TurnRequest,
)

if TYPE_CHECKING:  # the values layer sits above the store; the windows are built there
    from ..values import BudgetWindow

__all__ = ["PlaneStatus", "read_status"]


@attrs.frozen
class PlaneStatus:
    """Queue, seats, leases, cooldowns and policy at one instant (``now``, epoch milliseconds)."""

    now: int
    requests_by_state: dict[str, int]
    queue_depth: int
    queued_with_payload: int
    oldest_wait_ms: int | None
    seats_in_use: int
    leases_by_phase: dict[str, int]
    suspects_by_phase: dict[str, int]
    cooldowns: tuple[tuple[str, str, int], ...]
    durable_policy: tuple[int, int, int, int, int] | None
    drain_state: str | None
    event_count: int
    last_event_seq: int
    #: The live policy revision in force (0: none set) and its policy document (``Policy.to_json``).
    policy_revision: int = 0
    policy_document: dict[str, Any] | None = None
    #: Queued requests by lane: ``{lane: (queued, with payload)}``.
    queue_by_lane: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    #: Per provider/model key: ``(provider, model, queued, seats held)``.
    keys: tuple[tuple[str, str, int, int], ...] = ()
    #: How many sessions hold as many seats as the per-session limit allows (``None``: no limit).
    sessions_at_limit: int | None = None
    #: Paused scopes: ``(lane, provider, model, since)``, ``''`` where the scope names no part.
    pauses: tuple[tuple[str, str, str, int], ...] = ()
    #: Every window of every budget of the policy in force (added by the caller; see the module).
    budgets: tuple[BudgetWindow, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready mapping (cooldowns as objects with ``remaining_ms``)."""
        data = attrs.asdict(self)
        data["cooldowns"] = [
            {"provider": provider, "model": model, "not_before": not_before, "remaining_ms": not_before - self.now}
            for provider, model, not_before in self.cooldowns
        ]
        if self.durable_policy is not None:
            names = (
                "max_active_turns",
                "max_concurrent_starts",
                "min_start_interval_ms",
                "queue_timeout_ms",
                "capacity_cooldown_ms",
            )
            data["durable_policy"] = dict(zip(names, self.durable_policy, strict=True))
        data["queue_by_lane"] = {
            lane: {"queued": queued, "with_payload": ready} for lane, (queued, ready) in self.queue_by_lane.items()
        }
        data["keys"] = [
            {"provider": provider, "model": model, "queued": queued, "seats": seats}
            for provider, model, queued, seats in self.keys
        ]
        data["pauses"] = [
            {"scope": _scope(lane, provider), "lane": lane or None, "provider": provider or None,
             "model": model or None, "since": since}
            for lane, provider, model, since in self.pauses
        ]  # fmt: skip
        data["budgets"] = [
            {
                **window.to_json(),
                "next_reset_in_ms": None if window.next_reset_at is None else max(0, window.next_reset_at - self.now),
            }
            for window in self.budgets
        ]
        return data


def read_status(engine: Engine, now: int) -> PlaneStatus:
    """Read the plane's status in one read-only transaction."""
    seat_phases = [str(phase) for phase in SEAT_PHASES]
    queued = TurnRequest.state == str(RequestState.QUEUED)
    with engine.connect() as connection, deferred(connection).begin():
        by_state = dict(connection.execute(select(TurnRequest.state, func.count()).group_by(TurnRequest.state)).all())
        oldest = connection.execute(select(func.min(TurnRequest.enqueued_at)).where(queued)).scalar()
        with_payload = connection.execute(
            select(func.count())
            .select_from(TurnRequest)
            .join(TurnPayload, TurnPayload.request_id == TurnRequest.request_id)
            .where(queued)
        ).scalar_one()
        phases = connection.execute(
            select(
                Lease.phase,
                func.count(),
                func.sum(case((Lease.suspect_since.is_not(None), 1), else_=0)),
            ).group_by(Lease.phase)
        ).all()
        cooldowns = connection.execute(
            select(Cooldown.provider, Cooldown.model, Cooldown.not_before)
            .where(Cooldown.not_before > now)
            .order_by(Cooldown.not_before)
        ).all()
        policy = connection.execute(
            select(
                PolicyState.max_active_turns,
                PolicyState.max_concurrent_starts,
                PolicyState.min_start_interval_ms,
                PolicyState.queue_timeout_ms,
                PolicyState.capacity_cooldown_ms,
                PolicyState.drain_state,
            )
        ).first()
        event_count, last_seq = connection.execute(
            select(func.count(), func.coalesce(func.max(Event.event_seq), 0))
        ).one()
        revision, document = connection.execute(
            select(PolicyState.revision, PolicyRevision.document).outerjoin(
                PolicyRevision, PolicyRevision.revision == PolicyState.revision
            )
        ).first() or (0, None)
        lanes = connection.execute(
            select(TurnRequest.lane, func.count()).where(queued).group_by(TurnRequest.lane)
        ).all()
        ready_lanes = dict(connection.execute(select(QueueEntry.lane, func.count()).group_by(QueueEntry.lane)).all())
        queued_keys = connection.execute(
            select(TurnRequest.provider, TurnRequest.model, func.count())
            .where(queued)
            .group_by(TurnRequest.provider, TurnRequest.model)
        ).all()
        held = connection.execute(
            select(TurnRequest.provider, TurnRequest.model, TurnRequest.session_id)
            .join(Lease, Lease.request_id == TurnRequest.request_id)
            .where(Lease.phase.in_(seat_phases))
        ).all()
        pauses = connection.execute(
            select(AdmissionPause.lane, AdmissionPause.provider, AdmissionPause.model, AdmissionPause.since)
        ).all()
    leases = {str(phase): int(count) for phase, count, _ in phases}
    policy_document = json.loads(document) if isinstance(document, str) else None
    seats_by_key: dict[tuple[str, str], int] = {}
    seats_by_session: dict[str, int] = {}
    for provider, model, session in held:
        seats_by_key[(provider, model)] = seats_by_key.get((provider, model), 0) + 1
        seats_by_session[session] = seats_by_session.get(session, 0) + 1
    queued_by_key = {(str(p), str(m)): int(n) for p, m, n in queued_keys}
    limit = None if policy_document is None else policy_document.get("max_turns_per_session")
    return PlaneStatus(
        now=now,
        requests_by_state={str(state): int(count) for state, count in sorted(by_state.items())},
        queue_depth=int(by_state.get(str(RequestState.QUEUED), 0)),
        queued_with_payload=int(with_payload),
        oldest_wait_ms=None if oldest is None else max(0, now - int(oldest)),
        seats_in_use=sum(count for phase, count in leases.items() if phase in seat_phases),
        leases_by_phase=leases,
        suspects_by_phase={str(phase): int(suspects or 0) for phase, _, suspects in phases if suspects},
        cooldowns=tuple((str(p), str(m), int(nb)) for p, m, nb in cooldowns),
        durable_policy=None if policy is None else _policy_tuple(policy),
        drain_state=None if policy is None else str(policy.drain_state),
        event_count=int(event_count),
        last_event_seq=int(last_seq),
        policy_revision=int(revision or 0),
        policy_document=policy_document,
        queue_by_lane={str(lane): (int(n), int(ready_lanes.get(lane, 0))) for lane, n in sorted(lanes)},
        keys=tuple(
            (provider, model, queued_by_key.get((provider, model), 0), seats_by_key.get((provider, model), 0))
            for provider, model in sorted(set(queued_by_key) | set(seats_by_key))
        ),
        sessions_at_limit=None
        if not isinstance(limit, int)
        else sum(1 for held_seats in seats_by_session.values() if held_seats >= limit),
        pauses=tuple((str(lane), str(p), str(m), int(since)) for lane, p, m, since in sorted(pauses)),
    )


def _policy_tuple(policy: Any) -> tuple[int, int, int, int, int]:
    return (
        int(policy.max_active_turns),
        int(policy.max_concurrent_starts),
        int(policy.min_start_interval_ms),
        int(policy.queue_timeout_ms),
        int(policy.capacity_cooldown_ms),
    )


def _scope(lane: str, provider: str) -> str:
    if lane:
        return "lane"
    return "key" if provider else "all"
