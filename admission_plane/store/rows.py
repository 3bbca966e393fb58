"""Named records for the rows the statements return.

Each record's fields are its query's column labels in order (checked where the query is
defined, see :class:`~admission_plane.store.tx.Query`), so a row is built in exactly one
place, :meth:`Tx.one <admission_plane.store.tx.Tx.one>` (through :meth:`Row.from_row`),
and read by name everywhere else.

``from_row`` checks what the readers rely on: each column's storage type (SQLite keeps any
value in any column, so a corrupted row may hold text where a blob or an integer belongs)
and that a state is one of :class:`~admission_plane.states.RequestState`. A row that fails
raises the documented error for a row that cannot be trusted: :class:`PayloadIntegrityError`
for a payload, :class:`SchemaIntegrityError` otherwise, never a raw ``TypeError``. Records
whose readers validate every field themselves, with their own documented errors (the
recovery inventory, the journal, the durable policy), are built unchecked. Values are
otherwise the driver's: the service layer still checks ranges and formats.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self

import attrs

from ..errors import AdmissionError, PayloadIntegrityError, SchemaIntegrityError
from ..states import RequestState

__all__ = [
    "BudgetUsageRow",
    "Candidate",
    "ChargeRow",
    "CooldownRow",
    "CreditRow",
    "DispatchRow",
    "EntryRow",
    "EventRow",
    "IdentityRow",
    "KeyHeadRow",
    "LeaseRow",
    "LeaseWithRequestRow",
    "MemberHeadRow",
    "OwnerRow",
    "PauseRow",
    "PayloadRow",
    "PolicyRow",
    "QueuedEntry",
    "QueuedOwnerRow",
    "RequestMeta",
    "RequestRow",
    "RequestStatus",
    "RevisionRow",
    "Row",
    "SeatRow",
    "as_params",
]

Check = Callable[[object], bool]
_STATES = frozenset(str(state) for state in RequestState)


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_blob(value: object) -> bool:
    return isinstance(value, bytes | bytearray | memoryview)


def _is_state(value: object) -> bool:
    return isinstance(value, str) and value in _STATES


def _is_text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _is_boolean(value: object) -> bool:
    return isinstance(value, bool) or value in (0, 1)


def _is_integer_or_none(value: object) -> bool:
    return value is None or _is_integer(value)


def _checks(
    *,
    text: str = "",
    integer: str = "",
    blob: str = "",
    state: str = "",
    text_or_none: str = "",
    boolean: str = "",
    integer_or_none: str = "",
) -> dict[str, Check]:
    """Column -> check, from the space-separated column names of each kind."""
    kinds: dict[Check, str] = {
        _is_text: text, _is_integer: integer, _is_blob: blob, _is_state: state, _is_text_or_none: text_or_none,
        _is_boolean: boolean, _is_integer_or_none: integer_or_none,
    }  # fmt: skip
    return {name: check for check, names in kinds.items() for name in names.split()}


def as_params(record: attrs.AttrsInstance) -> dict[str, Any]:
    """A record's fields as statement parameters, by name (``attrs.asdict`` without its recursion)."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


@functools.cache
def _field_names(cls: type[attrs.AttrsInstance]) -> tuple[str, ...]:
    return tuple(field.name for field in attrs.fields(cls))


class Row:
    """Base of the records: :meth:`from_row` builds one from a driver row, checking it first."""

    __slots__ = ()
    #: Column -> check of its stored value (empty: the reader validates every field itself).
    CHECKS: ClassVar[Mapping[str, Check]] = {}

    if TYPE_CHECKING:
        __attrs_attrs__: ClassVar[Any]

        def __init__(self, *values: Any) -> None: ...

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Self:
        """The record of ``row``; :meth:`untrusted` if a column fails its check."""
        record = cls(*row)
        checks = cls.__dict__.get("_checks_by_position")
        if checks is None:
            checks = cls._position_checks()
        for position, name, check in checks:
            if not check(row[position]):
                raise cls.untrusted(name)
        return record

    @classmethod
    def _position_checks(cls) -> tuple[tuple[int, str, Check], ...]:
        """:attr:`CHECKS` by column position, worked out once per class (rows are checked on every read)."""
        positions = {field.name: index for index, field in enumerate(attrs.fields(cls))}
        checks = tuple((positions[name], name, check) for name, check in cls.CHECKS.items())
        type.__setattr__(cls, "_checks_by_position", checks)
        return checks

    @classmethod
    def untrusted(cls, column: str) -> AdmissionError:
        """The error for a row whose ``column`` cannot be trusted (one line, naming no value)."""
        return SchemaIntegrityError(f"a stored row holds an invalid {column}")


@attrs.frozen
class RequestMeta(Row):
    """A request's immutable metadata (what an idempotent enqueue compares)."""

    CHECKS = _checks(text="session_id agent_id fingerprint provider model lane")
    session_id: Any
    agent_id: Any
    fingerprint: Any
    provider: Any
    model: Any
    lane: Any


@attrs.frozen
class RequestRow(Row):
    """A request's metadata, state and enqueue time."""

    CHECKS = _checks(
        text="request_id session_id agent_id fingerprint provider model", state="state", integer="enqueued_at"
    )
    request_id: Any
    session_id: Any
    agent_id: Any
    fingerprint: Any
    provider: Any
    model: Any
    state: Any
    enqueued_at: Any


@attrs.frozen
class RequestStatus(Row):
    """A request's state and the connector it is bound to while queued."""

    CHECKS = _checks(state="state", text_or_none="queued_owner_instance_id")
    state: Any
    queued_owner_instance_id: Any


@attrs.frozen
class PayloadRow(Row):
    """A sealed prompt as stored."""

    CHECKS = _checks(blob="nonce ciphertext auth_tag", integer="key_version expires_at", text="content_fingerprint")
    nonce: Any
    ciphertext: Any
    auth_tag: Any
    key_version: Any
    content_fingerprint: Any
    expires_at: Any

    @classmethod
    def untrusted(cls, column: str) -> AdmissionError:
        """A payload that cannot be trusted fails like a tampered one."""
        return PayloadIntegrityError()


@attrs.frozen
class OwnerRow(Row):
    """A queued owner's recorded connector identity."""

    CHECKS = _checks(
        text="owner_instance_id created_at boot_id start_time_ticks",
        integer="pid pid_namespace_inode ppid pgrp session",
    )
    owner_instance_id: Any
    created_at: Any
    boot_id: Any
    pid: Any
    start_time_ticks: Any
    pid_namespace_inode: Any
    ppid: Any
    pgrp: Any
    session: Any


@attrs.frozen
class QueuedOwnerRow(Row):
    """A queued request and the identity of the connector that enqueued it."""

    request_id: Any
    owner_instance_id: Any
    created_at: Any
    boot_id: Any
    pid: Any
    start_time_ticks: Any
    pid_namespace_inode: Any
    ppid: Any
    pgrp: Any
    session: Any
    host_id: Any


@attrs.frozen
class Candidate(Row):
    """The request the admission rule would admit next, and its last lease generation."""

    CHECKS = _checks(text="request_id", integer="lease_generation")
    request_id: Any
    lease_generation: Any


@attrs.frozen
class QueuedEntry(Row):
    """Where a queued request with a payload stands."""

    CHECKS = _checks(integer="enqueued_at", text="provider model")
    enqueued_at: Any
    provider: Any
    model: Any


@attrs.frozen
class LeaseRow(Row):
    """A lease's fence and phase, and whether its request holds a budget reservation (``charged``)."""

    CHECKS = _checks(
        text="lease_id request_id owner_instance_id", integer="generation", state="phase", boolean="charged"
    )
    lease_id: Any
    request_id: Any
    generation: Any
    owner_instance_id: Any
    phase: Any
    charged: Any = False


@attrs.frozen
class LeaseWithRequestRow(Row):
    """A lease's fence and phase beside its request's state and generation."""

    CHECKS = _checks(
        text="lease_id request_id owner_instance_id",
        integer="generation request_generation",
        state="phase request_state",
    )
    lease_id: Any
    request_id: Any
    generation: Any
    owner_instance_id: Any
    phase: Any
    request_state: Any
    request_generation: Any


@attrs.frozen
class IdentityRow(Row):
    """The process evidence recorded with a dispatch intent (without its lease id, time and host)."""

    CHECKS = _checks(
        text="request_id owner_instance_id prompt_channel connector_owner_instance_id connector_created_at "
        "connector_boot_id connector_start_time_ticks child_boot_id child_start_time_ticks",
        integer="lease_generation connector_pid connector_pid_namespace_inode connector_ppid connector_pgrp "
        "connector_session child_pid child_pid_namespace_inode child_ppid child_pgrp child_session",
    )
    request_id: Any
    lease_generation: Any
    owner_instance_id: Any
    prompt_channel: Any
    connector_owner_instance_id: Any
    connector_created_at: Any
    connector_boot_id: Any
    connector_pid: Any
    connector_start_time_ticks: Any
    connector_pid_namespace_inode: Any
    connector_ppid: Any
    connector_pgrp: Any
    connector_session: Any
    child_boot_id: Any
    child_pid: Any
    child_start_time_ticks: Any
    child_pid_namespace_inode: Any
    child_ppid: Any
    child_pgrp: Any
    child_session: Any


@attrs.frozen
class DispatchRow(Row):
    """A lease, its request and its process evidence (every evidence column ``None`` when absent)."""

    lease_id: Any
    lease_request_id: Any
    generation: Any
    owner_instance_id: Any
    phase: Any
    heartbeat_at: Any
    request_id: Any
    session_id: Any
    provider: Any
    model: Any
    request_state: Any
    request_generation: Any
    enqueued_at: Any
    identity_lease_id: Any
    identity_request_id: Any
    identity_generation: Any
    identity_owner_instance_id: Any
    prompt_channel: Any
    connector_owner_instance_id: Any
    connector_created_at: Any
    connector_boot_id: Any
    connector_pid: Any
    connector_start_time_ticks: Any
    connector_pid_namespace_inode: Any
    connector_ppid: Any
    connector_pgrp: Any
    connector_session: Any
    child_boot_id: Any
    child_pid: Any
    child_start_time_ticks: Any
    child_pid_namespace_inode: Any
    child_ppid: Any
    child_pgrp: Any
    child_session: Any
    host_id: Any


@attrs.frozen
class EventRow(Row):
    """One journal row."""

    event_seq: Any
    kind: Any
    from_state: Any
    to_state: Any
    occurred_at: Any
    correlation_hmac: Any


@attrs.frozen
class PolicyRow(Row):
    """The durable policy row."""

    max_active_turns: Any
    max_concurrent_starts: Any
    min_start_interval_ms: Any
    queue_timeout_ms: Any
    capacity_cooldown_ms: Any
    drain_state: Any
    policy_fingerprint: Any
    revision: Any
    document: Any


# --- policy v2 ------------------------------------------------------------------------------------


@attrs.frozen
class RevisionRow(Row):
    """A live policy revision (its document is parsed and checked by :meth:`Policy.from_json`)."""

    CHECKS = _checks(integer="revision created_at", text="document")
    revision: Any
    created_at: Any
    document: Any


@attrs.frozen
class PauseRow(Row):
    """A paused scope (``''`` where a part is not named)."""

    CHECKS = _checks(text="lane provider model", integer="since")
    lane: Any
    provider: Any
    model: Any
    since: Any


@attrs.frozen
class CreditRow(Row):
    """A lane's credits in the current round of the weighted share."""

    CHECKS = _checks(text="lane", integer="credits")
    lane: Any
    credits: Any


@attrs.frozen
class CooldownRow(Row):
    """A provider/model cooling down until ``not_before``."""

    CHECKS = _checks(text="provider model", integer="not_before")
    provider: Any
    model: Any
    not_before: Any


@attrs.frozen
class SeatRow(Row):
    """A seat-holding lease and what admission counts it against."""

    CHECKS = _checks(state="phase", integer="acquired_at", text="provider model agent_id session_id")
    phase: Any
    acquired_at: Any
    provider: Any
    model: Any
    agent_id: Any
    session_id: Any


@attrs.frozen
class EntryRow(Row):
    """A queued request's place in the admission index."""

    CHECKS = _checks(text="lane provider model agent_id session_id", integer="enqueued_at")
    lane: Any
    provider: Any
    model: Any
    agent_id: Any
    session_id: Any
    enqueued_at: Any


@attrs.frozen
class KeyHeadRow(Row):
    """A (lane, provider, model) group and its head."""

    CHECKS = _checks(text="lane provider model head_request_id", integer="head_enqueued_at")
    lane: Any
    provider: Any
    model: Any
    head_enqueued_at: Any
    head_request_id: Any


@attrs.frozen
class MemberHeadRow(Row):
    """An agent (or session) group inside its parent group, and its head."""

    CHECKS = _checks(text="member head_request_id", integer="head_enqueued_at")
    member: Any
    head_enqueued_at: Any
    head_request_id: Any


@attrs.frozen
class BudgetUsageRow(Row):
    """What counts in one budget window: requests, tokens still reserved, tokens used, the oldest charge."""

    CHECKS = _checks(integer="requests reserved_tokens used_tokens", integer_or_none="oldest")
    requests: Any
    reserved_tokens: Any
    used_tokens: Any
    oldest: Any


@attrs.frozen
class ChargeRow(Row):
    """One charge in a window, oldest first: when, and the requests and tokens it counts."""

    CHECKS = _checks(integer="charged_at requests tokens")
    charged_at: Any
    requests: Any
    tokens: Any
