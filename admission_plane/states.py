"""Request states, lease phases and the one table of every transition between them.

A request and its lease move together: while a seat is held the lease's ``phase`` equals
the request's ``state``. :data:`TRANSITIONS` lists every edge the plane writes (and the
few more a journal written by the original connector may hold); every phase set below is
derived from it, and :func:`admission_plane.service._transitions.change` is the one
function that applies an edge. No other module spells a phase.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from enum import StrEnum

import attrs


class RequestState(StrEnum):
    """Every state a turn request can be in (the original's twelve)."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    STARTING = "starting"
    DISPATCH_INTENT = "dispatch_intent"
    DISPATCH_AMBIGUOUS = "dispatch_ambiguous"
    ACTIVE = "active"
    PROVIDER_TERMINAL = "provider_terminal"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    QUEUE_TIMEOUT = "queue_timeout"
    RECOVERY_REQUIRED = "recovery_required"


class EventKind(StrEnum):
    """Kinds of journal events."""

    REQUEST_ENQUEUED = "request_enqueued"
    REQUEST_CANCELLED = "request_cancelled"
    REQUEST_ABANDONED = "request_abandoned"
    REQUEST_QUEUE_TIMED_OUT = "request_queue_timed_out"
    REQUEST_ADMITTED = "request_admitted"
    REQUEST_STARTING = "request_starting"
    REQUEST_DISPATCH_INTENT = "request_dispatch_intent"
    REQUEST_ACTIVE = "request_active"
    REQUEST_DISPATCH_AMBIGUOUS = "request_dispatch_ambiguous"
    REQUEST_PROVIDER_TERMINAL = "request_provider_terminal"
    REQUEST_RELEASED = "request_released"
    REQUEST_RECOVERY_REQUIRED = "request_recovery_required"
    REQUEST_RECOVERY_SEAT_RELEASED = "request_recovery_seat_released"
    QUEUED_OWNER_DEAD = "queued_owner_dead"
    POLICY_DRAIN_COMPLETED = "policy_drain_completed"
    # Beyond the seed:
    LEASE_OWNER_DEAD = "lease_owner_dead"
    OPERATOR_SEAT_RELEASED = "operator_seat_released"
    RECOVERY_ROW_RETAINED = "recovery_row_retained"
    # Policy v2 (they name a scope's kind, never a lane, provider or model):
    POLICY_REVISED = "policy_revised"
    ADMISSION_PAUSED = "admission_paused"
    ADMISSION_RESUMED = "admission_resumed"
    # Budgets (they name no provider, model or amount; a turn's are correlated with its request):
    BUDGET_RESERVED = "budget_reserved"
    BUDGET_SETTLED = "budget_settled"
    BUDGET_USAGE_RECORDED = "budget_usage_recorded"
    BUDGET_CORRECTED = "budget_corrected"


class DrainState(StrEnum):
    """The durable policy's drain state, as the ``policy_state`` row stores it."""

    STEADY = "steady"
    SOFT_DRAINING_TO_1 = "soft_draining_to_1"

    @property
    def journal_token(self) -> str:
        """How the journal spells this state (``policy_steady``, ``policy_soft_draining_to_1``)."""
        return f"policy_{self.value}"


#: The journal's source state of an enqueue (the request did not exist).
ABSENT = "absent"
#: The correlation input of policy events (they concern no request).
POLICY_EVENT_ID = "policy-state"
#: The journal's states of a recovery row the reaper could not trust and left alone (it names no request).
UNTRUSTED, RETAINED = "untrusted", "retained"
#: The correlation input of those events: never the row's own ids, which are exactly what cannot be trusted.
RECOVERY_ROW_EVENT_ID = "recovery-inventory"
#: The journal's states of pause and resume: admission runs, or one kind of scope is paused.
ADMITTING = "admitting"
PAUSE_STATES = {"all": "paused_all", "lane": "paused_lane", "key": "paused_key"}


class ChargeState(StrEnum):
    """A budget charge's state (``budget_charges.state``), also the journal's budget states.

    A turn's charge is ``reserved`` at admission and settles, when its seat is freed, to
    ``reconciled`` (the turn reported its usage), ``charged`` (it did not: the estimate
    stands), ``retained`` (``recovery_required``: the provider may have charged it, the
    reservation stays) or ``refunded`` (no prompt was written: the row is deleted).
    ``external`` and ``correction`` are usage recorded outside the plane and a correction
    from the provider's remaining-budget headers.
    """

    UNCHARGED = "uncharged"
    RESERVED = "reserved"
    RECONCILED = "reconciled"
    CHARGED = "charged"
    RETAINED = "retained"
    REFUNDED = "refunded"
    EXTERNAL = "external"
    CORRECTION = "correction"


#: The journal's source state of usage recorded outside the plane and of a correction.
OUTSIDE_PLANE = "outside_plane"
#: The correlation input of those events (they concern no request).
BUDGET_EVENT_ID = "budget-usage"


class LeaseEffect(enum.Enum):
    """What an edge does to the request's lease row."""

    NONE = "the request has no lease"
    CREATE = "inserts the lease (takes a seat and a start slot)"
    MOVE = "sets the lease's phase to the target"
    KEEP = "leaves the lease as it is; only the request's state changes"
    DELETE = "deletes the lease, which frees its seat"


class Capacity(enum.Flag):
    """What an edge gives back to admission."""

    NOTHING = 0
    SEAT = enum.auto()
    START_SLOT = enum.auto()


@attrs.frozen
class Transition:
    """One edge of the state machine.

    ``written=False`` marks an edge this library never writes but accepts when it reads a
    journal written by the original connector.
    """

    event: EventKind
    source: str
    target: str
    lease: LeaseEffect
    frees: Capacity = Capacity.NOTHING
    written: bool = True
    #: ``Capacity.SEAT in frees`` and ``Capacity.START_SLOT in frees``, worked out once: every
    #: transaction asks, and a flag test costs several enum calls.
    frees_seat: bool = attrs.field(init=False, eq=False, repr=False)
    frees_start_slot: bool = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "frees_seat", Capacity.SEAT in self.frees)
        object.__setattr__(self, "frees_start_slot", Capacity.START_SLOT in self.frees)


def _edges(
    event: EventKind,
    sources: Iterable[str],
    targets: Iterable[str],
    lease: LeaseEffect,
    frees: Capacity = Capacity.NOTHING,
    *,
    written: bool = True,
) -> tuple[Transition, ...]:
    return tuple(Transition(event, s, t, lease, frees, written) for s in sources for t in targets)


S, K, L, C = RequestState, EventKind, LeaseEffect, Capacity
_NOT_STARTED = (S.ADMITTED, S.STARTING, S.DISPATCH_INTENT)
_STARTED = (S.DISPATCH_AMBIGUOUS, S.ACTIVE)

#: Every edge, as (event, from, to, lease effect, what it frees). The rows read as the lifecycle:
#: enqueue, leave the queue, take a seat, start, dispatch, and the ways a seat is given back.
TRANSITIONS: tuple[Transition, ...] = (
    *_edges(K.REQUEST_ENQUEUED, [ABSENT], [S.QUEUED], L.NONE),
    *_edges(K.REQUEST_CANCELLED, [S.QUEUED], [S.CANCELLED], L.NONE),
    *_edges(K.QUEUED_OWNER_DEAD, [S.QUEUED], [S.CANCELLED], L.NONE),
    *_edges(K.REQUEST_QUEUE_TIMED_OUT, [S.QUEUED], [S.QUEUE_TIMEOUT], L.NONE),
    *_edges(K.REQUEST_ADMITTED, [S.QUEUED], [S.ADMITTED], L.CREATE),
    *_edges(K.REQUEST_STARTING, [S.ADMITTED], [S.STARTING], L.MOVE),
    *_edges(K.REQUEST_DISPATCH_INTENT, [S.STARTING], [S.DISPATCH_INTENT], L.MOVE),
    *_edges(K.REQUEST_ACTIVE, [S.DISPATCH_INTENT], [S.ACTIVE], L.MOVE, C.START_SLOT),
    *_edges(K.REQUEST_DISPATCH_AMBIGUOUS, [S.DISPATCH_INTENT], [S.DISPATCH_AMBIGUOUS], L.MOVE, C.START_SLOT),
    *_edges(K.REQUEST_ABANDONED, _NOT_STARTED, [S.FAILED, S.CANCELLED], L.DELETE, C.SEAT | C.START_SLOT),
    *_edges(K.REQUEST_RECOVERY_REQUIRED, [S.STARTING, S.DISPATCH_INTENT], [S.RECOVERY_REQUIRED], L.MOVE, C.START_SLOT),
    *_edges(K.REQUEST_RECOVERY_REQUIRED, _STARTED, [S.RECOVERY_REQUIRED], L.MOVE),
    *_edges(K.REQUEST_RECOVERY_REQUIRED, [S.ADMITTED], [S.RECOVERY_REQUIRED], L.MOVE, C.START_SLOT, written=False),
    *_edges(K.REQUEST_RECOVERY_REQUIRED, [S.RECOVERY_REQUIRED], [S.RECOVERY_REQUIRED], L.MOVE, written=False),
    *_edges(K.REQUEST_PROVIDER_TERMINAL, [S.ACTIVE], [S.PROVIDER_TERMINAL], L.KEEP),
    *_edges(K.REQUEST_RELEASED, [S.PROVIDER_TERMINAL], [S.COMPLETED, S.FAILED, S.CANCELLED], L.DELETE, C.SEAT),
    *_edges(K.REQUEST_RECOVERY_SEAT_RELEASED, _NOT_STARTED, [S.RECOVERY_REQUIRED], L.DELETE, C.SEAT | C.START_SLOT),
    *_edges(
        K.REQUEST_RECOVERY_SEAT_RELEASED, [*_STARTED, S.RECOVERY_REQUIRED], [S.RECOVERY_REQUIRED], L.DELETE, C.SEAT
    ),
    *_edges(
        K.POLICY_DRAIN_COMPLETED,
        [DrainState.SOFT_DRAINING_TO_1.journal_token],
        [DrainState.STEADY.journal_token],
        L.NONE,
    ),
    # Beyond the seed. A connector proved gone before its dispatch intent wrote no prompt: its turn ends.
    *_edges(K.LEASE_OWNER_DEAD, [S.ADMITTED, S.STARTING], [S.CANCELLED], L.DELETE, C.SEAT | C.START_SLOT),
    # The operator frees a seat evidence cannot (a host gone for good): never a requeue, never a replay.
    *_edges(K.OPERATOR_SEAT_RELEASED, [S.ADMITTED, S.STARTING], [S.CANCELLED], L.DELETE, C.SEAT | C.START_SLOT),
    *_edges(K.OPERATOR_SEAT_RELEASED, [S.DISPATCH_INTENT], [S.RECOVERY_REQUIRED], L.DELETE, C.SEAT | C.START_SLOT),
    *_edges(K.OPERATOR_SEAT_RELEASED, [*_STARTED, S.RECOVERY_REQUIRED], [S.RECOVERY_REQUIRED], L.DELETE, C.SEAT),
    # A recovery row the reaper could not trust: reported, changed in no way.
    *_edges(K.RECOVERY_ROW_RETAINED, [UNTRUSTED], [RETAINED], L.NONE),
    # Policy v2: a live policy revision (it ends a soft drain in progress), pause and resume.
    *_edges(
        K.POLICY_REVISED,
        [DrainState.STEADY.journal_token, DrainState.SOFT_DRAINING_TO_1.journal_token],
        [DrainState.STEADY.journal_token],
        L.NONE,
    ),
    *_edges(K.ADMISSION_PAUSED, [ADMITTING], PAUSE_STATES.values(), L.NONE),
    *_edges(K.ADMISSION_RESUMED, PAUSE_STATES.values(), [ADMITTING], L.NONE),
    # Budgets: a turn's reservation and its settlement; usage and corrections from outside the plane.
    *_edges(K.BUDGET_RESERVED, [ChargeState.UNCHARGED], [ChargeState.RESERVED], L.NONE),
    *_edges(
        K.BUDGET_SETTLED,
        [ChargeState.RESERVED],
        [ChargeState.RECONCILED, ChargeState.CHARGED, ChargeState.RETAINED, ChargeState.REFUNDED],
        L.NONE,
    ),
    *_edges(K.BUDGET_USAGE_RECORDED, [OUTSIDE_PLANE], [ChargeState.EXTERNAL], L.NONE),
    *_edges(K.BUDGET_CORRECTED, [OUTSIDE_PLANE], [ChargeState.CORRECTION], L.NONE),
)

_BY_EDGE: dict[tuple[str, str, str], Transition] = {(t.event, t.source, t.target): t for t in TRANSITIONS}


def _targets(*effects: LeaseEffect) -> frozenset[RequestState]:
    return frozenset(S(t.target) for t in TRANSITIONS if t.lease in effects)


def _sources(event: EventKind) -> frozenset[RequestState]:
    return frozenset(S(t.source) for t in TRANSITIONS if t.event is event and t.written)


def _outcomes(event: EventKind) -> frozenset[RequestState]:
    return frozenset(S(t.target) for t in TRANSITIONS if t.event is event)


def _start_window() -> frozenset[RequestState]:
    """Phases that occupy a start slot: from where a lease is created, along moves that keep it."""
    window = set(_targets(LeaseEffect.CREATE))
    grew = True
    while grew:
        grew = False
        for t in TRANSITIONS:
            keeps = t.lease is LeaseEffect.MOVE and Capacity.START_SLOT not in t.frees
            if keeps and t.source in window and t.target not in window:
                window.add(S(t.target))
                grew = True
    return frozenset(window)


def _terminal() -> frozenset[RequestState]:
    """States never left again (a seat held in one may still be released, staying in it)."""
    leaving = {t.source for t in TRANSITIONS if t.source != t.target}
    return frozenset(state for state in RequestState if state not in leaving)


#: Phases a lease can be in; every lease holds a seat until it is deleted.
SEAT_PHASES: frozenset[RequestState] = _targets(LeaseEffect.CREATE, LeaseEffect.MOVE)
#: Phases inside the start window (admission is held back while these reach ``max_concurrent_starts``).
START_WINDOW_PHASES: frozenset[RequestState] = _start_window()
#: Start-window phases after ``mark_starting`` (what it counts against ``max_concurrent_starts``).
STARTING_PHASES: frozenset[RequestState] = START_WINDOW_PHASES - _targets(LeaseEffect.CREATE)
#: Start-window phases before the dispatch intent: no process evidence may exist yet.
BEFORE_DISPATCH_PHASES: frozenset[RequestState] = START_WINDOW_PHASES - _outcomes(EventKind.REQUEST_DISPATCH_INTENT)
#: Phases from which the connector may still prove no prompt was written.
ABANDONABLE_PHASES: frozenset[RequestState] = _sources(EventKind.REQUEST_ABANDONED)
#: Phases that may enter execution recovery (a dispatch may have happened).
EXECUTION_RECOVERY_PHASES: frozenset[RequestState] = _sources(EventKind.REQUEST_RECOVERY_REQUIRED)
#: Phases whose seat the reaper may release once every process is proved gone.
RELEASABLE_PHASES: frozenset[RequestState] = _sources(EventKind.REQUEST_RECOVERY_SEAT_RELEASED)
#: Phases whose seat the reaper frees once the connector holding the lease is proved gone (no prompt yet).
OWNER_DEATH_PHASES: frozenset[RequestState] = _sources(EventKind.LEASE_OWNER_DEAD)
#: How the turn of a lease whose holder was proved gone ends (the table has exactly one outcome).
(OWNER_DEATH_OUTCOME,) = _outcomes(EventKind.LEASE_OWNER_DEAD)
#: Where the operator's release leaves a request, by the phase of its lease (every seat phase has one).
OPERATOR_RELEASE_OUTCOMES: dict[RequestState, RequestState] = {
    S(t.source): S(t.target) for t in TRANSITIONS if t.event is EventKind.OPERATOR_SEAT_RELEASED
}
#: Terminal request states: never left again.
TERMINAL_STATES: frozenset[RequestState] = _terminal()
#: Outcomes a live turn or a pre-prompt abandonment may end with.
LIVE_OUTCOMES: frozenset[RequestState] = _outcomes(EventKind.REQUEST_RELEASED)
ABANDON_OUTCOMES: frozenset[RequestState] = _outcomes(EventKind.REQUEST_ABANDONED)
#: Once the prompt may have been written (``active``), and on every terminal path, the payload is deleted.
PAYLOAD_DELETED_STATES: frozenset[RequestState] = TERMINAL_STATES | {RequestState.ACTIVE}

#: Every ``(kind, from_state, to_state)`` triple the journal accepts, on write and on read.
EVENT_TRANSITIONS: frozenset[tuple[str, str, str]] = frozenset(_BY_EDGE)
#: Every state token the journal may hold.
EVENT_STATES: frozenset[str] = frozenset(state for t in TRANSITIONS for state in (t.source, t.target))


def transition(event: str, source: str, target: str) -> Transition | None:
    """The edge ``source -> target`` journalled as ``event``, or ``None`` if the table has none."""
    return _BY_EDGE.get((event, source, target))


def is_allowed_transition(kind: str, from_state: str, to_state: str) -> bool:
    """Whether the journal accepts this ``(kind, from, to)`` triple."""
    return (kind, from_state, to_state) in _BY_EDGE


def _check_table() -> None:
    """The table's own consistency; a broken edit fails at import, not in production."""
    for t in TRANSITIONS:
        if (t.lease is LeaseEffect.DELETE) != (Capacity.SEAT in t.frees):
            raise AssertionError(f"{t}: exactly the edges that delete the lease free its seat")
        if Capacity.START_SLOT in t.frees and t.source not in START_WINDOW_PHASES:
            raise AssertionError(f"{t}: only a start-window phase can free a start slot")
        leaves_window = t.source in START_WINDOW_PHASES and t.target not in START_WINDOW_PHASES
        if t.lease is LeaseEffect.MOVE and leaves_window != (Capacity.START_SLOT in t.frees):
            raise AssertionError(f"{t}: a move out of the start window frees the start slot")
    if OWNER_DEATH_PHASES != BEFORE_DISPATCH_PHASES:
        raise AssertionError("an owner's death ends a turn exactly where no prompt can have been written")
    operator = [t.source for t in TRANSITIONS if t.event is EventKind.OPERATOR_SEAT_RELEASED]
    if len(operator) != len(set(operator)) or set(operator) != SEAT_PHASES:
        raise AssertionError("the operator's release has exactly one edge from every seat phase")


_check_table()


class SuspectReason(StrEnum):
    """Why a lease was marked suspect."""

    HEARTBEAT_EXPIRED = "heartbeat_expired"
    IDENTITY_UNVERIFIABLE = "identity_unverifiable"


class PromptChannel(StrEnum):
    """How the dispatch child receives its prompt."""

    STDIN = "stdin"
    PTY = "pty"


class FailureCategory(StrEnum):
    """Why a live turn failed; ``provider_capacity`` cools the provider/model down."""

    PROVIDER_CAPACITY = "provider_capacity"
    QUOTA = "quota"
    AUTH = "auth"
    PERMISSION = "permission"
    TIMEOUT = "timeout"
    TRANSPORT = "transport"
    UNKNOWN = "unknown"


__all__ = [
    "ABANDONABLE_PHASES",
    "ABANDON_OUTCOMES",
    "ABSENT",
    "ADMITTING",
    "BEFORE_DISPATCH_PHASES",
    "EVENT_STATES",
    "EVENT_TRANSITIONS",
    "EXECUTION_RECOVERY_PHASES",
    "LIVE_OUTCOMES",
    "OPERATOR_RELEASE_OUTCOMES",
    "OWNER_DEATH_OUTCOME",
    "OWNER_DEATH_PHASES",
    "PAUSE_STATES",
    "PAYLOAD_DELETED_STATES",
    "POLICY_EVENT_ID",
    "RECOVERY_ROW_EVENT_ID",
    "RELEASABLE_PHASES",
    "RETAINED",
    "SEAT_PHASES",
    "STARTING_PHASES",
    "START_WINDOW_PHASES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "UNTRUSTED",
    "Capacity",
    "DrainState",
    "EventKind",
    "FailureCategory",
    "LeaseEffect",
    "PromptChannel",
    "RequestState",
    "SuspectReason",
    "Transition",
    "is_allowed_transition",
    "transition",
]
