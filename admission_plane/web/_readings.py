"""One consistent reading of the plane for ``/metrics`` and the dashboard.

The tables are read in one read-only transaction (the queue through its index, requests
only in the states that are not history, seat-holding leases, which the policy bounds),
together with the journal's new events; the live policy, the pauses and the budget
windows come from the plane's own reads. Nothing here writes. A reading names no request,
session or agent: a lease appears only under an opaque handle (an HMAC of its id under a
key that lives and dies with this server), which only this server can turn back into the
lease.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import attrs
from sqlalchemy import Engine

from ..errors import AdmissionError
from ..host import default_host_id
from ..policy import Policy
from ..states import START_WINDOW_PHASES, RequestState
from ..store.engine import deferred
from ..store.statements.metrics import (
    ACTIVE_COOLDOWNS,
    LEASES_BY_PHASE,
    POLICY_CLAIMED,
    QUEUE_BY_KEY,
    QUEUED_TOTAL,
    REQUESTS_BY_LIVE_STATE,
    SEAT_LEASES,
    SEATS_BY_KEY,
)
from ..values import BudgetWindow, Pause
from ._journal import JournalFigures, JournalFollower

#: The most seat-holding leases a reading lists one by one (the counts are always whole).
LEASE_ROWS = 200
_START_WINDOW = frozenset(str(phase) for phase in START_WINDOW_PHASES)
_RECOVERY = str(RequestState.RECOVERY_REQUIRED)


@attrs.frozen
class QueueGroup:
    """Admissible queued requests (holding their payload) of one lane and provider/model key."""

    lane: str
    provider: str
    model: str
    depth: int
    oldest_enqueued_at: int


@attrs.frozen
class SeatGroup:
    """Seats held (and start slots taken) by one lane and provider/model key."""

    lane: str
    provider: str
    model: str
    seats: int
    starts: int


@attrs.frozen
class LeaseView:
    """A seat-holding lease as an operator may see it: no request, session, agent or host name."""

    handle: str
    phase: str
    lane: str
    provider: str
    model: str
    acquired_at: int
    heartbeat_at: int
    suspect_reason: str | None
    #: ``"this host"``, ``"another host"``, or ``"no evidence"`` (before its dispatch intent).
    evidence: str


@attrs.frozen
class Reading:
    """The plane at ``now`` (epoch ms)."""

    now: int
    #: Admissible queued requests (holding their payload), by lane and key.
    queue: tuple[QueueGroup, ...]
    #: Every queued request, and the oldest one's enqueue time.
    queued_total: int
    queued_oldest: int | None
    requests_by_state: dict[str, int]
    leases_by_phase: dict[str, int]
    suspects_by_phase: dict[str, int]
    seats: tuple[SeatGroup, ...]
    leases: tuple[LeaseView, ...]
    cooldowns: tuple[tuple[str, str, int], ...]
    #: ``None`` when no policy was ever claimed (or the durable row cannot be read).
    policy: Policy | None
    policy_revision: int | None
    pauses: tuple[Pause, ...]
    journal: JournalFigures
    #: Every window of every budget of the policy in force (:meth:`AdmissionPlane.budget_status`).
    budgets: tuple[BudgetWindow, ...] = ()

    @property
    def queue_depth(self) -> int:
        """Every queued request."""
        return self.queued_total

    @property
    def oldest_enqueued_at(self) -> int | None:
        """When the oldest queued request was enqueued."""
        return self.queued_oldest

    @property
    def queued_without_payload(self) -> int:
        """Queued requests whose payload is not stored yet (not admissible until it is)."""
        return max(0, self.queued_total - sum(group.depth for group in self.queue))

    @property
    def seats_in_use(self) -> int:
        """Every seat held."""
        return sum(group.seats for group in self.seats)

    @property
    def starts_in_window(self) -> int:
        """Leases in the start window (counted against ``max_concurrent_starts``)."""
        return sum(count for phase, count in self.leases_by_phase.items() if phase in _START_WINDOW)

    @property
    def recovery_required(self) -> int:
        """Requests in ``recovery_required`` (with or without a seat)."""
        return self.requests_by_state.get(_RECOVERY, 0)


class Reader:
    """Reads the plane (``plane`` is an :class:`~admission_plane.AdmissionPlane` or anything with its reads)."""

    def __init__(self, plane: Any, handle_key: bytes) -> None:
        self._plane = plane
        self._engine: Engine = plane.engine
        self._host_id: str = getattr(plane, "host_id", None) or default_host_id()
        self._handle_key = handle_key
        self.journal = JournalFollower()

    def handle(self, lease_id: str) -> str:
        """The opaque handle of a lease (stable while this server runs, meaningless elsewhere)."""
        return hmac.new(self._handle_key, lease_id.encode(), hashlib.sha256).hexdigest()[:24]

    def lease_for(self, handle: str) -> str | None:
        """The lease id behind ``handle`` among the seat-holding leases, or ``None``."""
        with self._engine.connect() as connection, deferred(connection).begin():
            rows = connection.execute(SEAT_LEASES, {"limit": 100_000}).all()
        for row in rows:
            if hmac.compare_digest(self.handle(str(row.lease_id)), handle):
                return str(row.lease_id)
        return None

    def read(self, now: int) -> Reading:
        """One reading (see the module docstring)."""
        with self._engine.connect() as connection, deferred(connection).begin():
            queue = connection.execute(QUEUE_BY_KEY).all()
            queued = connection.execute(QUEUED_TOTAL).one()
            states = connection.execute(REQUESTS_BY_LIVE_STATE).all()
            phases = connection.execute(LEASES_BY_PHASE).all()
            seats = connection.execute(SEATS_BY_KEY).all()
            leases = connection.execute(SEAT_LEASES, {"limit": LEASE_ROWS}).all()
            cooldowns = connection.execute(ACTIVE_COOLDOWNS, {"now": now}).all()
            claimed = bool(connection.execute(POLICY_CLAIMED).scalar_one())
            journal = self.journal.advance(connection, now)
        policy, revision = self._policy(claimed)
        return Reading(
            now=now,
            queue=tuple(
                QueueGroup(str(r.lane), str(r.provider), str(r.model), int(r.depth), int(r.oldest)) for r in queue
            ),
            queued_total=int(queued.total),
            queued_oldest=None if queued.oldest is None else int(queued.oldest),
            requests_by_state={
                **{str(r.state): int(r.total) for r in states},
                str(RequestState.QUEUED): int(queued.total),
            },
            leases_by_phase={str(r.phase): int(r.total) for r in phases},
            suspects_by_phase={str(r.phase): int(r.suspects or 0) for r in phases if r.suspects},
            seats=tuple(
                SeatGroup(str(r.lane), str(r.provider), str(r.model), int(r.seats), int(r.starts or 0)) for r in seats
            ),
            leases=tuple(self._view(row) for row in leases),
            cooldowns=tuple((str(r.provider), str(r.model), int(r.not_before)) for r in cooldowns),
            policy=policy,
            policy_revision=revision,
            pauses=self._pauses(),
            journal=journal,
            budgets=self._budgets(now),
        )

    def _view(self, row: Any) -> LeaseView:
        if row.evidence is None:
            evidence = "no evidence"
        elif row.host_id is None or row.host_id == self._host_id:
            evidence = "this host"
        else:
            evidence = "another host"
        return LeaseView(
            handle=self.handle(str(row.lease_id)),
            phase=str(row.phase),
            lane=str(row.lane),
            provider=str(row.provider),
            model=str(row.model),
            acquired_at=int(row.acquired_at),
            heartbeat_at=int(row.heartbeat_at),
            suspect_reason=None if row.suspect_reason is None else str(row.suspect_reason),
            evidence=evidence,
        )

    def _policy(self, claimed: bool) -> tuple[Policy | None, int | None]:
        """The plane's policy; ``None`` when none was ever claimed (each connector then runs its own, and
        this server's default would be a guess) or the durable row cannot be read."""
        if not claimed:
            return None, 0
        try:
            current = self._plane.current_policy()
        except (AdmissionError, AttributeError):
            return None, None
        return current.policy, int(current.revision)

    def _budgets(self, now: int) -> tuple[BudgetWindow, ...]:
        """The budget windows (none when the policy in force cannot be read, as for :meth:`_policy`)."""
        try:
            return tuple(self._plane.budget_status(now))
        except (AdmissionError, AttributeError):
            return ()

    def _pauses(self) -> tuple[Pause, ...]:
        try:
            return tuple(self._plane.pauses())
        except (AdmissionError, AttributeError):
            return ()
