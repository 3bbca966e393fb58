"""admission_plane: a durable, cross-process admission plane for AI-agent turns.

At most N turns in flight across every process (and, with PostgreSQL, every machine);
fair, oldest-first admission; never a replayed turn; prompts sealed at rest; an
identifier-free audit journal. See the README for a tour.

The names below are loaded on first use, so importing a leaf such as
:mod:`admission_plane.evidence` or :mod:`admission_plane.errors` does not load the
database layer, the service or the turn API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clock import wall_clock_ms
    from .errors import (
        AdmissionBusyError,
        AdmissionConflictError,
        AdmissionDatabaseError,
        AdmissionError,
        AdmissionMigrationError,
        AdmissionRuntimeError,
        AdmissionStateError,
        BudgetError,
        InvalidInputError,
        LeaseFenceError,
        MissingKeyError,
        PayloadConflictError,
        PayloadExpiredError,
        PayloadIntegrityError,
        ProcessEvidenceError,
        ProcessGoneError,
        ProcessUnverifiableError,
        RecoverableDispatchInventoryError,
        SchemaIntegrityError,
        SessionLimitError,
        UnknownLeaseError,
        UnknownRequestError,
    )
    from .evidence import ConnectorIdentity, GroupResidue, Observation, ProcessIdentity
    from .plane import AdmissionPlane
    from .policy import Budget, KeyLimit, Lane, Policy
    from .service import AdmissionService, FaultInjection
    from .signals import Remaining, RetryAfter, remaining_from_headers, retry_after_from_headers
    from .states import EventKind, FailureCategory, PromptChannel, RequestState, SuspectReason
    from .turns import Backoff, DispatchRefusedError, Turn, TurnNotAdmittedError, run_turn, spawn_child, turn
    from .values import (
        AdmittedLease,
        BudgetWindow,
        DispatchIntentResult,
        DispatchProcessIdentity,
        DispatchRecord,
        EnqueueResult,
        LeaseFence,
        LeaseHolder,
        LiveTurnCompletion,
        LiveTurnFailure,
        Pause,
        PolicyRevision,
        QueueSnapshot,
        ReaperSummary,
        RecoverableDispatch,
        RecoverableQueuedOwner,
        RecoveryInventory,
        ReleasedLease,
        SanitizedEvent,
        StoredRequest,
        Usage,
    )

#: Where each public name is defined.
_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "AdmissionBusyError",
            "AdmissionConflictError",
            "AdmissionDatabaseError",
            "AdmissionError",
            "AdmissionMigrationError",
            "AdmissionRuntimeError",
            "AdmissionStateError",
            "BudgetError",
            "InvalidInputError",
            "LeaseFenceError",
            "MissingKeyError",
            "PayloadConflictError",
            "PayloadExpiredError",
            "PayloadIntegrityError",
            "ProcessEvidenceError",
            "ProcessGoneError",
            "ProcessUnverifiableError",
            "RecoverableDispatchInventoryError",
            "SchemaIntegrityError",
            "SessionLimitError",
            "UnknownLeaseError",
            "UnknownRequestError",
        ),
        "errors",
    ),
    **dict.fromkeys(("ConnectorIdentity", "GroupResidue", "Observation", "ProcessIdentity"), "evidence"),
    **dict.fromkeys(("EventKind", "FailureCategory", "PromptChannel", "RequestState", "SuspectReason"), "states"),
    **dict.fromkeys(
        ("Backoff", "DispatchRefusedError", "Turn", "TurnNotAdmittedError", "run_turn", "spawn_child", "turn"), "turns"
    ),
    **dict.fromkeys(
        (
            "AdmittedLease",
            "BudgetWindow",
            "DispatchIntentResult",
            "DispatchProcessIdentity",
            "DispatchRecord",
            "EnqueueResult",
            "LeaseFence",
            "LeaseHolder",
            "LiveTurnCompletion",
            "LiveTurnFailure",
            "Pause",
            "PolicyRevision",
            "QueueSnapshot",
            "ReaperSummary",
            "RecoverableDispatch",
            "RecoverableQueuedOwner",
            "RecoveryInventory",
            "ReleasedLease",
            "SanitizedEvent",
            "StoredRequest",
            "Usage",
        ),
        "values",
    ),
    "AdmissionPlane": "plane",
    "AdmissionService": "service",
    "FaultInjection": "service",
    "Budget": "policy",
    "KeyLimit": "policy",
    "Lane": "policy",
    "Policy": "policy",
    "Remaining": "signals",
    "RetryAfter": "signals",
    "remaining_from_headers": "signals",
    "retry_after_from_headers": "signals",
    "wall_clock_ms": "clock",
}

__all__ = [
    "AdmissionBusyError",
    "AdmissionConflictError",
    "AdmissionDatabaseError",
    "AdmissionError",
    "AdmissionMigrationError",
    "AdmissionPlane",
    "AdmissionRuntimeError",
    "AdmissionService",
    "AdmissionStateError",
    "AdmittedLease",
    "Backoff",
    "Budget",
    "BudgetError",
    "BudgetWindow",
    "ConnectorIdentity",
    "DispatchIntentResult",
    "DispatchProcessIdentity",
    "DispatchRecord",
    "DispatchRefusedError",
    "EnqueueResult",
    "EventKind",
    "FailureCategory",
    "FaultInjection",
    "GroupResidue",
    "InvalidInputError",
    "KeyLimit",
    "Lane",
    "LeaseFence",
    "LeaseFenceError",
    "LeaseHolder",
    "LiveTurnCompletion",
    "LiveTurnFailure",
    "MissingKeyError",
    "Observation",
    "Pause",
    "PayloadConflictError",
    "PayloadExpiredError",
    "PayloadIntegrityError",
    "Policy",
    "PolicyRevision",
    "ProcessEvidenceError",
    "ProcessGoneError",
    "ProcessIdentity",
    "ProcessUnverifiableError",
    "PromptChannel",
    "QueueSnapshot",
    "ReaperSummary",
    "RecoverableDispatch",
    "RecoverableDispatchInventoryError",
    "RecoverableQueuedOwner",
    "RecoveryInventory",
    "ReleasedLease",
    "Remaining",
    "RequestState",
    "RetryAfter",
    "SanitizedEvent",
    "SchemaIntegrityError",
    "SessionLimitError",
    "StoredRequest",
    "SuspectReason",
    "Turn",
    "TurnNotAdmittedError",
    "UnknownLeaseError",
    "UnknownRequestError",
    "Usage",
    "remaining_from_headers",
    "retry_after_from_headers",
    "run_turn",
    "spawn_child",
    "turn",
    "wall_clock_ms",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
