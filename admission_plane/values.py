"""Frozen value objects passed to and returned by :class:`~admission_plane.AdmissionPlane`."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

import attrs

from . import _validate as v
from .errors import InvalidInputError
from .policy import Policy
from .signals import RetryAfter
from .states import ABANDON_OUTCOMES, LIVE_OUTCOMES, FailureCategory, PromptChannel, RequestState

if TYPE_CHECKING:
    from .evidence import ConnectorIdentity, ProcessIdentity

E = TypeVar("E", bound=Enum)


def _identifier(label: str) -> Callable[[object, attrs.Attribute[str], object], None]:
    def check(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
        v.identifier(value, label)

    return check


def _enum(enum_type: type[E], value: object, message: str) -> E:
    try:
        return enum_type(value)
    except ValueError:
        raise InvalidInputError(message) from None


# attrs converters are named functions so that mypy's attrs plugin can read their types.
def _prompt_channel(value: object) -> PromptChannel:
    return _enum(PromptChannel, value, "prompt channel must be stdin or pty")


def _failure_category(value: object) -> FailureCategory:
    return _enum(FailureCategory, value, "live turn failure category is invalid")


def _completion_outcome(value: object) -> RequestState:
    return _enum(RequestState, value, "live turn completion outcome is invalid")


def _positive(label: str) -> Callable[[object, attrs.Attribute[int], object], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
        v.positive_integer(value, label)

    return check


def _uuid_owner(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    v.owner_instance_id(value)


def _http_status(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not v.is_safe_integer(value) or not 100 <= value <= 599):
        raise InvalidInputError("live turn failure HTTP status is invalid")


def _signal(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        v.identifier(value, "live turn failure signal")


def _retry_after(instance: object, attribute: attrs.Attribute[RetryAfter | None], value: object) -> None:
    if value is not None and not isinstance(value, RetryAfter):
        raise InvalidInputError("live turn failure retry_after must be an admission_plane.RetryAfter")


@attrs.frozen
class LeaseFence:
    """The fence every lease operation must present: lease id, generation and owner instance."""

    lease_id: str = attrs.field(validator=_identifier("lease ID"))
    generation: int = attrs.field(validator=_positive("lease generation"))
    owner_instance_id: str = attrs.field(validator=_identifier("lease owner instance ID"))


@attrs.frozen
class AdmittedLease:
    """A lease issued by admission: the fence to present on every later call, and its request.

    ``starting`` is true when the admission also moved the lease to ``starting`` in its own transaction
    (:meth:`~admission_plane.AdmissionPlane.wait_for_admission` with ``start=True``): the connector then
    skips :meth:`~admission_plane.AdmissionPlane.mark_starting`, which would refuse it. It says what the
    lease was when it was returned, not what it is now, and takes no part in equality.
    """

    lease_id: str
    request_id: str
    generation: int
    owner_instance_id: str
    starting: bool = attrs.field(default=False, eq=False, kw_only=True)

    @property
    def fence(self) -> LeaseFence:
        return LeaseFence(self.lease_id, self.generation, self.owner_instance_id)


@attrs.frozen
class EnqueueResult:
    """Whether the request was new (``existed=False``) or an idempotent replay; and, for an enqueue asked to admit
    its request too (``enqueue_with_payload(admit_as=...)``), the lease when it was admitted in the same
    transaction (``None``: not admitted yet, or not asked)."""

    request_id: str
    existed: bool
    admitted: AdmittedLease | None = None


@attrs.frozen
class StoredRequest:
    """A request's immutable metadata and current state."""

    request_id: str
    session_id: str
    agent_id: str
    fingerprint: str
    provider: str
    model: str
    state: RequestState
    enqueued_at: int


@attrs.frozen
class QueueSnapshot:
    """Where a queued request stands: 1-based positions, wait so far, and its model's cooldown."""

    request_id: str
    position: int
    eligible_position: int | None
    enqueued_at: int
    waited_ms: int
    cooldown_until: int | None


@attrs.frozen
class DispatchRecord:
    """Verified process evidence for a dispatch intent: the connector and its dispatch child.

    ``owner_instance_id`` must be a canonical UUID v4 and equal the connector's.
    """

    request_id: str = attrs.field(validator=_identifier("process record request ID"))
    lease_id: str = attrs.field(validator=_identifier("process record lease ID"))
    generation: int = attrs.field(validator=_positive("process record generation"))
    owner_instance_id: str = attrs.field(validator=_uuid_owner)
    connector: ConnectorIdentity = attrs.field()
    child: ProcessIdentity = attrs.field()
    prompt_channel: PromptChannel = attrs.field(converter=_prompt_channel)

    def __attrs_post_init__(self) -> None:
        from .evidence import ConnectorIdentity, ProcessIdentity

        # Checked as given: callers without type checking may pass anything.
        connector: object = self.connector
        child: object = self.child
        if not isinstance(connector, ConnectorIdentity) or not isinstance(child, ProcessIdentity):
            raise InvalidInputError("dispatch record needs a ConnectorIdentity and a ProcessIdentity")
        if self.connector.owner_instance_id != self.owner_instance_id:
            raise InvalidInputError("dispatch record connector owner does not match the lease owner")

    @classmethod
    def for_lease(
        cls,
        lease: AdmittedLease,
        connector: ConnectorIdentity,
        child: ProcessIdentity,
        *,
        prompt_channel: PromptChannel | str,
    ) -> DispatchRecord:
        """The dispatch record of ``lease``'s turn: ``connector`` (the plane's
        :attr:`~admission_plane.AdmissionPlane.owner_identity`) hands the prompt to ``child`` over
        ``prompt_channel`` (``"stdin"`` or ``"pty"``).

        The request, lease, generation and owner are the lease's, so they cannot be mixed up. Raises
        :class:`~admission_plane.errors.InvalidInputError` when ``lease`` is not an :class:`AdmittedLease`, or
        when ``connector`` is not the lease's owner (a lease admitted by another plane is not this one's to
        dispatch).
        """
        given: object = lease
        if not isinstance(given, AdmittedLease):
            raise InvalidInputError("dispatch record needs the AdmittedLease its turn was admitted with")
        return cls(
            request_id=lease.request_id,
            lease_id=lease.lease_id,
            generation=lease.generation,
            owner_instance_id=lease.owner_instance_id,
            connector=connector,
            child=child,
            prompt_channel=prompt_channel,
        )

    @property
    def fence(self) -> LeaseFence:
        return LeaseFence(self.lease_id, self.generation, self.owner_instance_id)


@attrs.frozen
class DispatchIntentResult:
    """Outcome of recording process identity with the dispatch intent.

    ``status`` is ``committed``/``not_committed`` (or ``recorded``/``not_recorded`` from
    :meth:`~admission_plane.AdmissionPlane.record_process_identity`); ``reason`` is one of
    ``stale_lease``, ``conflicting_intent``, ``invalid_process_identity``, ``transaction_fault``.
    """

    status: str
    idempotent: bool | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


@attrs.frozen
class LiveTurnFailure:
    """Why a live turn failed (``provider_capacity`` starts a cooldown of its provider/model).

    ``retry_after`` is the provider's own answer (:mod:`admission_plane.signals`): a
    ``provider_capacity`` failure then cools down until then, capped by the policy's
    ``max_cooldown_ms``, instead of for the policy's fixed ``capacity_cooldown_ms``.
    """

    category: FailureCategory = attrs.field(converter=_failure_category)
    http_status: int | None = attrs.field(default=None, validator=_http_status)
    code: str | None = attrs.field(default=None, validator=_signal)
    reason: str | None = attrs.field(default=None, validator=_signal)
    retry_after: RetryAfter | None = attrs.field(default=None, validator=_retry_after)


#: The most tokens one turn may report or estimate (a safe integer far beyond any context window).
MAX_TOKENS = 2**40


def _tokens(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not v.is_safe_integer(value) or not 0 <= value <= MAX_TOKENS:
        raise InvalidInputError(f"usage {attribute.name} must be an integer from 0 to {MAX_TOKENS}")


@attrs.frozen
class Usage:
    """What a turn used, as the provider reported it: input and output tokens.

    Budgets count :attr:`tokens` (input plus output). Build it from a response's usage block,
    e.g. ``Usage(input_tokens=body["usage"]["input_tokens"], output_tokens=...)``.
    """

    input_tokens: int = attrs.field(default=0, validator=_tokens)
    output_tokens: int = attrs.field(default=0, validator=_tokens)

    @property
    def tokens(self) -> int:
        """Input plus output tokens: what a token budget counts."""
        return self.input_tokens + self.output_tokens


def estimated_tokens(value: object) -> int | None:
    """Check an enqueue's ``estimated_tokens`` (``None``: no estimate)."""
    if value is None:
        return None
    if not v.is_safe_integer(value) or not 0 <= value <= MAX_TOKENS:
        raise InvalidInputError(f"estimated_tokens must be an integer from 0 to {MAX_TOKENS} or None")
    return value


def _usage(instance: object, attribute: attrs.Attribute[Usage | None], value: object) -> None:
    if value is not None and not isinstance(value, Usage):
        raise InvalidInputError("live turn usage must be a Usage")


@attrs.frozen
class LiveTurnCompletion:
    """How a live turn ended: ``completed``, ``cancelled``, or ``failed`` with an optional failure.

    ``usage`` is what the provider reported the turn used: its budget reservation is settled
    to it (without it, the reservation stands as spent; see :mod:`admission_plane.service._budgets`).
    """

    outcome: RequestState = attrs.field(converter=_completion_outcome)
    failure: LiveTurnFailure | None = None
    usage: Usage | None = attrs.field(default=None, validator=_usage)

    def __attrs_post_init__(self) -> None:
        if self.outcome not in LIVE_OUTCOMES:
            raise InvalidInputError("live turn completion outcome is invalid")
        if self.failure is not None and self.outcome is not RequestState.FAILED:
            raise InvalidInputError("live turn completion failure is inconsistent")
        if self.failure is not None and not isinstance(self.failure, LiveTurnFailure):
            raise InvalidInputError("live turn completion failure must be a LiveTurnFailure")


def abandon_outcome(value: object) -> RequestState:
    """``failed`` or ``cancelled``: the outcomes of a pre-prompt abandonment."""
    try:
        outcome = RequestState(value) if isinstance(value, str) else None  # a non-string is never a state
    except ValueError:
        outcome = None
    if outcome not in ABANDON_OUTCOMES:
        raise InvalidInputError("pre-prompt abandonment outcome must be failed or cancelled")
    return outcome


@attrs.frozen
class DispatchProcessIdentity:
    """The process evidence recorded with a dispatch intent."""

    prompt_channel: PromptChannel
    connector: ConnectorIdentity
    child: ProcessIdentity


@attrs.frozen
class RecoverableDispatch:
    """A lease still holding a seat, for startup recovery and the reaper (no payload, no agent).

    ``host_id`` is the host that recorded ``process_identity`` (``None`` when unknown: no
    identity, or recorded before host identities existed).
    """

    request_id: str
    session_id: str
    provider: str
    model: str
    fence: LeaseFence
    phase: RequestState
    heartbeat_at: int
    process_identity: DispatchProcessIdentity | None
    host_id: str | None = None


@attrs.frozen
class RecoverableQueuedOwner:
    """A queued request and the connector identity that enqueued it (``host_id``: where it was captured)."""

    request_id: str
    owner: ConnectorIdentity
    host_id: str | None = None


@attrs.frozen
class SanitizedEvent:
    """One identifier-free journal row."""

    event_seq: int
    kind: str
    from_state: str
    to_state: str
    occurred_at: int
    correlation_hmac: str


@attrs.frozen
class ReaperSummary:
    """What one reaper pass did.

    ``inspected`` counts the leases it judged (each then ``released`` or ``retained``);
    ``untrusted`` (beyond the seed) counts inventory rows, leases or queued owners, that did
    not validate: each was journalled without identifiers and left exactly as it was.
    """

    inspected: int = 0
    released: int = 0
    retained: int = 0
    marked_recovery_required: int = 0
    suspected: int = 0
    queued_settled: int = 0
    untrusted: int = 0


@attrs.frozen
class LeaseHolder:
    """The recorded identity of the connector that holds a lease before its dispatch intent.

    ``owner`` is what the lease's owner instance recorded when it enqueued or admitted a
    request (its queued-owner record); ``host_id`` is the host that captured it.
    """

    request_id: str
    owner: ConnectorIdentity
    host_id: str | None = None


@attrs.frozen
class RecoveryInventory:
    """The recovery inventory read row by row, as the reaper judges it.

    Unlike :meth:`~admission_plane.AdmissionPlane.list_recoverable_dispatches`, which fails
    as a whole, a row that does not validate only adds to ``untrusted``; every other row
    is here. ``holders`` are the recorded holders of the leases before their dispatch intent.
    """

    queued_owners: tuple[RecoverableQueuedOwner, ...] = ()
    dispatches: tuple[RecoverableDispatch, ...] = ()
    holders: tuple[LeaseHolder, ...] = ()
    untrusted: int = 0


@attrs.frozen
class ReleasedLease:
    """What the operator's release did: the lease's phase before it, and the request's state after (never queued)."""

    phase: RequestState
    outcome: RequestState


@attrs.frozen
class PolicyRevision:
    """A live policy revision: its number (0: the claimed seed-shaped policy, never revised), when
    it was set (ms) and the policy it holds."""

    revision: int
    created_at: int
    policy: Policy


@attrs.frozen
class Pause:
    """A paused part of the plane: everything (all ``None``), a ``lane``, or a ``provider``/``model`` key."""

    lane: str | None
    provider: str | None
    model: str | None
    since: int

    @property
    def scope(self) -> str:
        """``"all"``, ``"lane"`` or ``"key"``."""
        if self.lane is not None:
            return "lane"
        return "all" if self.provider is None else "key"


@attrs.frozen
class BudgetWindow:
    """One budget window of a key as it stands at ``now``: its limits, what counts in it, what is left.

    ``requests`` and the tokens count every charge of the last ``window_ms`` milliseconds:
    admitted turns (``reserved_tokens`` while a turn has not settled, or is retained in
    ``recovery_required``; ``used_tokens`` once it settled), usage recorded outside the plane
    and the provider's corrections. ``remaining_*`` is ``None`` where the budget sets no such
    limit; ``next_reset_at`` is when the oldest charge leaves the window (``None``: empty).
    """

    provider: str
    model: str | None
    window_ms: int
    max_requests: int | None
    max_tokens: int | None
    requests: int
    reserved_tokens: int
    used_tokens: int
    remaining_requests: int | None
    remaining_tokens: int | None
    next_reset_at: int | None

    def to_json(self) -> dict[str, object]:
        """The window as a JSON-ready mapping (``status --json``)."""
        return attrs.asdict(self)
