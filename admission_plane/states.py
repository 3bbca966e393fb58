"""Request states, lease phases, and the journal's transition allowlist, as data.

A request and its lease move together: the lease's ``phase`` mirrors the request's
``state`` while a seat is held. :data:`EVENT_TRANSITIONS` is the complete set of
``(kind, from_state, to_state)`` triples the journal accepts, on write and on read.
"""

from __future__ import annotations

from enum import StrEnum


class RequestState(StrEnum):
    """Every state a turn request can be in (the seed's 12)."""

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


S = RequestState

#: Phases that hold a seat: only deleting the lease frees it.
SEAT_PHASES: frozenset[RequestState] = frozenset(
    {S.ADMITTED, S.STARTING, S.DISPATCH_INTENT, S.DISPATCH_AMBIGUOUS, S.ACTIVE, S.RECOVERY_REQUIRED}
)
#: Phases inside the start window (admission is held back while these reach ``max_concurrent_starts``).
START_WINDOW_PHASES: frozenset[RequestState] = frozenset({S.ADMITTED, S.STARTING, S.DISPATCH_INTENT})
#: Phases counted by ``mark_starting`` against ``max_concurrent_starts``.
STARTING_PHASES: frozenset[RequestState] = frozenset({S.STARTING, S.DISPATCH_INTENT})
#: Phases from which the connector may still prove no prompt was written.
ABANDONABLE_PHASES: frozenset[RequestState] = frozenset({S.ADMITTED, S.STARTING, S.DISPATCH_INTENT})
#: Phases that may enter execution recovery (a dispatch may have happened).
EXECUTION_RECOVERY_PHASES: frozenset[RequestState] = frozenset(
    {S.STARTING, S.DISPATCH_INTENT, S.DISPATCH_AMBIGUOUS, S.ACTIVE}
)
#: Terminal request states: never left again.
TERMINAL_STATES: frozenset[RequestState] = frozenset(
    {S.COMPLETED, S.FAILED, S.CANCELLED, S.QUEUE_TIMEOUT, S.RECOVERY_REQUIRED}
)
#: Outcomes a live turn or a pre-prompt abandonment may end with.
LIVE_OUTCOMES: frozenset[RequestState] = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
ABANDON_OUTCOMES: frozenset[RequestState] = frozenset({S.FAILED, S.CANCELLED})


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


K = EventKind
ABSENT = "absent"
POLICY_STEADY = "policy_steady"
POLICY_SOFT_DRAINING_TO_1 = "policy_soft_draining_to_1"
#: The correlation id of the drain-completion event.
POLICY_EVENT_ID = "policy-state"

#: Every state token the journal may hold.
EVENT_STATES: frozenset[str] = frozenset({*RequestState, ABSENT, POLICY_STEADY, POLICY_SOFT_DRAINING_TO_1})

EVENT_TRANSITIONS: frozenset[tuple[str, str, str]] = frozenset(
    {
        (K.REQUEST_ENQUEUED, ABSENT, S.QUEUED),
        (K.REQUEST_CANCELLED, S.QUEUED, S.CANCELLED),
        (K.QUEUED_OWNER_DEAD, S.QUEUED, S.CANCELLED),
        *((K.REQUEST_ABANDONED, phase, outcome) for phase in ABANDONABLE_PHASES for outcome in ABANDON_OUTCOMES),
        (K.REQUEST_QUEUE_TIMED_OUT, S.QUEUED, S.QUEUE_TIMEOUT),
        (K.REQUEST_ADMITTED, S.QUEUED, S.ADMITTED),
        (K.REQUEST_STARTING, S.ADMITTED, S.STARTING),
        (K.REQUEST_DISPATCH_INTENT, S.STARTING, S.DISPATCH_INTENT),
        (K.REQUEST_ACTIVE, S.DISPATCH_INTENT, S.ACTIVE),
        (K.REQUEST_DISPATCH_AMBIGUOUS, S.DISPATCH_INTENT, S.DISPATCH_AMBIGUOUS),
        (K.REQUEST_PROVIDER_TERMINAL, S.ACTIVE, S.PROVIDER_TERMINAL),
        *((K.REQUEST_RELEASED, S.PROVIDER_TERMINAL, outcome) for outcome in LIVE_OUTCOMES),
        *((K.REQUEST_RECOVERY_REQUIRED, phase, S.RECOVERY_REQUIRED) for phase in SEAT_PHASES),
        *((K.REQUEST_RECOVERY_SEAT_RELEASED, phase, S.RECOVERY_REQUIRED) for phase in SEAT_PHASES),
        (K.POLICY_DRAIN_COMPLETED, POLICY_SOFT_DRAINING_TO_1, POLICY_STEADY),
    }
)

#: The lease state machine of the generic transition path: (from, to) -> event kind.
LEASE_TRANSITIONS: dict[tuple[RequestState, RequestState], EventKind] = {
    (S.ADMITTED, S.STARTING): K.REQUEST_STARTING,
    (S.STARTING, S.DISPATCH_INTENT): K.REQUEST_DISPATCH_INTENT,
    (S.DISPATCH_INTENT, S.ACTIVE): K.REQUEST_ACTIVE,
    (S.DISPATCH_INTENT, S.DISPATCH_AMBIGUOUS): K.REQUEST_DISPATCH_AMBIGUOUS,
}


def is_allowed_transition(kind: str, from_state: str, to_state: str) -> bool:
    """Whether the journal accepts this ``(kind, from, to)`` triple."""
    return (kind, from_state, to_state) in EVENT_TRANSITIONS


class SuspectReason(StrEnum):
    """Why a lease was marked suspect."""

    HEARTBEAT_EXPIRED = "heartbeat_expired"
    IDENTITY_UNVERIFIABLE = "identity_unverifiable"


class DrainState(StrEnum):
    """The durable policy's drain state."""

    STEADY = "steady"
    SOFT_DRAINING_TO_1 = "soft_draining_to_1"


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
