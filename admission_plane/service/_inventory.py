"""Turning durable recovery rows into trusted values, fail closed.

For the listings (``list_recoverable_dispatches``, ``list_recoverable_queued_owners``) any
row that does not validate makes the whole listing raise
:class:`~admission_plane.errors.RecoverableDispatchInventoryError`, the seed's contract.
The reaper reads the same rows one by one (:func:`triage`): a row that does not validate
is counted and never acted on, and cannot keep every other lease from being judged.
Request fields are checked by the same rules enqueue used to accept them
(:func:`admission_plane._validate.request_field`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from .. import _validate as v
from ..errors import InvalidInputError, RecoverableDispatchInventoryError
from ..evidence import ConnectorIdentity, ProcessIdentity
from ..states import BEFORE_DISPATCH_PHASES, SEAT_PHASES, PromptChannel, RequestState
from ..store.rows import DispatchRow, QueuedOwnerRow
from ..values import (
    DispatchProcessIdentity,
    DispatchRecord,
    LeaseFence,
    LeaseHolder,
    RecoverableDispatch,
    RecoverableQueuedOwner,
    RecoveryInventory,
)

_RECORD_KEYS = frozenset({"requestId", "leaseId", "generation", "ownerInstanceId", "processIdentity", "promptChannel"})
_UNTRUSTED = (InvalidInputError, TypeError, ValueError)
Row = TypeVar("Row")
Entry = TypeVar("Entry")


def dispatch_from_row(row: DispatchRow) -> RecoverableDispatch:
    """One ``LIST_DISPATCHES`` row as a :class:`RecoverableDispatch`."""
    try:
        return _dispatch(row)
    except _UNTRUSTED:
        raise RecoverableDispatchInventoryError() from None


def queued_owner_from_row(row: QueuedOwnerRow) -> RecoverableQueuedOwner:
    """One ``LIST_QUEUED_OWNERS`` row as a :class:`RecoverableQueuedOwner`."""
    try:
        return _queued_owner(row)
    except _UNTRUSTED:
        raise RecoverableDispatchInventoryError() from None


def triage(
    queued_owners: Iterable[QueuedOwnerRow], dispatches: Iterable[DispatchRow], holders: Iterable[QueuedOwnerRow]
) -> RecoveryInventory:
    """The rows of ``LIST_QUEUED_OWNERS``, ``LIST_DISPATCHES`` and ``LIST_LEASE_HOLDERS``, each judged alone."""
    owners, bad_owners = _each(queued_owners, _queued_owner)
    leases, bad_leases = _each(dispatches, _dispatch)
    held, bad_holders = _each(holders, _holder)
    return RecoveryInventory(owners, leases, held, bad_owners + bad_leases + bad_holders)


def _each(rows: Iterable[Row], convert: Callable[[Row], Entry]) -> tuple[tuple[Entry, ...], int]:
    """Every row that converts, and how many did not."""
    entries: list[Entry] = []
    untrusted = 0
    for row in rows:
        try:
            entries.append(convert(row))
        except _UNTRUSTED:
            untrusted += 1
    return tuple(entries), untrusted


def _queued_owner(row: QueuedOwnerRow) -> RecoverableQueuedOwner:
    return RecoverableQueuedOwner(*_owner_entry(row, "recoverable queued-owner request ID"))


def _holder(row: QueuedOwnerRow) -> LeaseHolder:
    return LeaseHolder(*_owner_entry(row, "lease holder request ID"))


def _owner_entry(row: QueuedOwnerRow, label: str) -> tuple[str, ConnectorIdentity, str | None]:
    """A recorded connector identity row: the request it concerns, the identity, the recording host."""
    request_id = v.identifier(row.request_id, label)
    connector = _connector(
        row.owner_instance_id,
        row.created_at,
        _process(row.boot_id, row.pid, row.start_time_ticks, row.pid_namespace_inode, row.ppid, row.pgrp, row.session),
    )
    return request_id, connector, _host(row.host_id)


def dispatch_record_from_mapping(value: object) -> DispatchRecord:
    """The original's camelCase dispatch record (exact keys at every level) as a :class:`DispatchRecord`."""
    if not isinstance(value, Mapping) or set(value) != _RECORD_KEYS:
        raise InvalidInputError("dispatch record must have the exact supported shape")
    identity = value["processIdentity"]
    if not isinstance(identity, Mapping) or set(identity) != {"connector", "child"}:
        raise InvalidInputError("dispatch record process identity must have the exact supported shape")
    return DispatchRecord(
        request_id=value["requestId"],
        lease_id=value["leaseId"],
        generation=value["generation"],
        owner_instance_id=value["ownerInstanceId"],
        connector=ConnectorIdentity.from_mapping(identity["connector"]),
        child=ProcessIdentity.from_mapping(identity["child"]),
        prompt_channel=value["promptChannel"],
    )


def _dispatch(row: DispatchRow) -> RecoverableDispatch:
    request_id = v.identifier(row.request_id, "recoverable dispatch request ID")
    v.identifier(row.lease_request_id, "recoverable dispatch lease request ID")
    fence = LeaseFence(
        v.identifier(row.lease_id, "recoverable dispatch lease ID"),
        v.positive_integer(row.generation, "recoverable dispatch lease generation"),
        v.identifier(row.owner_instance_id, "recoverable dispatch lease owner"),
    )
    v.positive_integer(row.request_generation, "recoverable dispatch request lease generation")
    lease_phase = _state(row.phase)
    state = _state(row.request_state)
    v.timestamp(row.heartbeat_at, "recoverable dispatch heartbeat")
    v.timestamp(row.enqueued_at, "recoverable dispatch enqueue timestamp")
    if row.lease_request_id != request_id or row.request_generation != fence.generation:
        raise InvalidInputError("lease/request fence mismatch")
    process_identity = _dispatch_identity(row, request_id, fence)
    if process_identity is not None and lease_phase in BEFORE_DISPATCH_PHASES:
        raise InvalidInputError("process identity predates dispatch intent")
    if lease_phase not in SEAT_PHASES or state != lease_phase:
        raise InvalidInputError("nonterminal lease/request state mismatch")
    return RecoverableDispatch(
        request_id=request_id,
        session_id=v.request_field("session_id", row.session_id),
        provider=v.request_field("provider", row.provider),
        model=v.request_field("model", row.model),
        fence=fence,
        phase=lease_phase,
        heartbeat_at=row.heartbeat_at,
        process_identity=process_identity,
        host_id=None if process_identity is None else _host(row.host_id),
    )


_IDENTITY_FIELDS = (
    "identity_lease_id", "identity_request_id", "identity_generation", "identity_owner_instance_id", "prompt_channel",
    "connector_owner_instance_id", "connector_created_at", "connector_boot_id", "connector_pid",
    "connector_start_time_ticks", "connector_pid_namespace_inode", "connector_ppid", "connector_pgrp",
    "connector_session", "child_boot_id", "child_pid", "child_start_time_ticks", "child_pid_namespace_inode",
    "child_ppid", "child_pgrp", "child_session",
)  # fmt: skip


def _dispatch_identity(row: DispatchRow, request_id: str, fence: LeaseFence) -> DispatchProcessIdentity | None:
    values = [getattr(row, name) for name in _IDENTITY_FIELDS]
    if all(value is None for value in values):
        return None
    if any(value is None for value in values):
        raise InvalidInputError("partial process identity")
    if (row.identity_lease_id, row.identity_request_id, row.identity_generation, row.identity_owner_instance_id) != (
        fence.lease_id,
        request_id,
        fence.generation,
        fence.owner_instance_id,
    ):
        raise InvalidInputError("process identity fence mismatch")
    try:
        prompt_channel = PromptChannel(row.prompt_channel)
    except ValueError:
        raise InvalidInputError("process identity prompt channel is invalid") from None
    connector = _connector(
        row.connector_owner_instance_id,
        row.connector_created_at,
        _process(row.connector_boot_id, row.connector_pid, row.connector_start_time_ticks,
                 row.connector_pid_namespace_inode, row.connector_ppid, row.connector_pgrp, row.connector_session),
    )  # fmt: skip
    if connector.owner_instance_id != fence.owner_instance_id:
        raise InvalidInputError("connector process identity owner mismatch")
    child = _process(row.child_boot_id, row.child_pid, row.child_start_time_ticks, row.child_pid_namespace_inode,
                     row.child_ppid, row.child_pgrp, row.child_session)  # fmt: skip
    return DispatchProcessIdentity(prompt_channel=prompt_channel, connector=connector, child=child)


def _connector(owner: Any, created_at: Any, process: ProcessIdentity) -> ConnectorIdentity:
    return ConnectorIdentity(owner_instance_id=v.owner_instance_id(owner), created_at=created_at, process=process)


def _process(boot_id: Any, pid: Any, ticks: Any, namespace: Any, ppid: Any, pgrp: Any, session: Any) -> ProcessIdentity:
    return ProcessIdentity(
        boot_id=boot_id,
        pid=pid,
        start_time_ticks=ticks,
        pid_namespace_inode=namespace,
        ppid=ppid,
        pgrp=pgrp,
        session=session,
    )


def _state(value: Any) -> RequestState:
    try:
        return RequestState(value)
    except ValueError:
        raise InvalidInputError("request state is invalid") from None


def _host(value: Any) -> str | None:
    return None if value is None else v.identifier(value, "recorded host ID")
