"""The exceptions callers catch.

Every error raised by :mod:`admission_plane` derives from :class:`AdmissionError`. The
seed's typed errors keep their exact messages (observable and matched by tests), and
none of them embeds a request or lease identifier.
"""

from __future__ import annotations

import re

__all__ = [
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
]


#: What would break a message's one line (or drive a terminal): C0 controls, DEL and Unicode line breaks.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def _one_line(part: object) -> object:
    """``part`` with every character of :data:`_UNPRINTABLE` shown as its escape (``part`` itself if not text)."""
    if not isinstance(part, str):
        return part
    return _UNPRINTABLE.sub(lambda found: found[0].encode("unicode_escape").decode("ascii"), part)


class AdmissionError(Exception):
    """Base class of every error this library raises on purpose.

    Its message is one line: a line break or other control character in it (from a path, a
    table name, a driver's text) is shown as its escape (``\\n``, ``\\x1b``).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(_one_line(arg) for arg in args))


class InvalidInputError(AdmissionError, ValueError):
    """An argument failed validation; nothing was written."""


class AdmissionStateError(AdmissionError):
    """The operation does not apply to the current durable state (the seed's plain ``Error``s).

    Examples: ``request is no longer queued``, ``lease is not admitted``,
    ``concurrent start limit reached``. The transaction was rolled back.
    """


class UnknownRequestError(AdmissionStateError, LookupError):
    """No request has the given id (message ``unknown request``)."""

    def __init__(self) -> None:
        super().__init__("unknown request")


class UnknownLeaseError(AdmissionStateError, LookupError):
    """No lease has the given id (message ``unknown lease``)."""

    def __init__(self) -> None:
        super().__init__("unknown lease")


class AdmissionConflictError(AdmissionError):
    """A request id was reused with different immutable metadata."""

    def __init__(self) -> None:
        super().__init__("request identity was reused with different immutable metadata")


class SessionLimitError(AdmissionError):
    """Enqueue refused: the session already has as many turns queued or in flight as the
    policy's ``max_turns_per_session`` allows (with ``session_overflow="refuse"``)."""

    def __init__(self) -> None:
        super().__init__("session already has the most turns the admission policy allows")


class BudgetError(InvalidInputError):
    """Enqueue refused: the request's estimated tokens exceed what a budget window of its key
    may ever hold (it could never be admitted). The attributes name the window and its limit."""

    def __init__(self, window_ms: int, max_tokens: int) -> None:
        self.window_ms = window_ms
        self.max_tokens = max_tokens
        super().__init__(f"estimated tokens exceed the {max_tokens}-token budget of a {window_ms} ms window")


class PayloadExpiredError(AdmissionError):
    """The request's sealed payload passed its expiry and was deleted."""

    def __init__(self) -> None:
        super().__init__("request payload has expired")


class PayloadConflictError(AdmissionError):
    """The request already holds a different durable payload."""

    def __init__(self) -> None:
        super().__init__("request already has a different durable payload")


class PayloadIntegrityError(AdmissionError):
    """A sealed payload failed authentication (tampered, swapped between rows, or the wrong key)."""

    def __init__(self) -> None:
        super().__init__("request payload failed authentication")


class MissingKeyError(AdmissionError):
    """The operation needs a key the plane was opened without (the message names which)."""


class LeaseFenceError(AdmissionError):
    """The lease is not owned by the supplied (lease id, generation, owner) fence."""

    def __init__(self) -> None:
        super().__init__("lease is not owned by the supplied generation fence")


class RecoverableDispatchInventoryError(AdmissionError):
    """Durable recovery inventory contains a row that cannot be trusted."""

    def __init__(self) -> None:
        super().__init__("recoverable dispatch inventory contains an invalid durable row")


class AdmissionMigrationError(AdmissionError):
    """The schema cannot be migrated (or adopted) safely; nothing was changed."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"admission schema migration failed: {detail}")
        self.detail = detail


class SchemaIntegrityError(AdmissionError):
    """A live database does not match the expected schema (fail closed, never repaired)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"admission schema integrity check failed: {detail}")
        self.detail = detail


class AdmissionRuntimeError(AdmissionError):
    """Durable runtime state (policy, drain) forbids the operation."""

    def __init__(self, message: str) -> None:
        super().__init__(f"admission runtime error: {message}")


class AdmissionDatabaseError(AdmissionError):
    """The database refused the operation for a reason other than lock contention.

    The transaction was rolled back; the driver's exception is chained as ``__cause__``.
    """


class AdmissionBusyError(AdmissionDatabaseError):
    """The database stayed locked (SQLite busy, PostgreSQL serialization failure) past the retry budget."""


class ProcessEvidenceError(AdmissionError):
    """Linux process evidence could not be captured."""


class ProcessGoneError(ProcessEvidenceError):
    """The process does not exist (``/proc/<pid>`` is absent)."""


class ProcessUnverifiableError(ProcessEvidenceError):
    """The process's evidence could not be read or parsed; nothing may be inferred from it."""
