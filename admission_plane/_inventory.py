"""Turning durable recovery rows into trusted values, fail closed.

Any row that does not validate makes the whole listing raise
:class:`~admission_plane.errors.RecoverableDispatchInventoryError`: recovery must never
act on a partly trusted inventory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import _validate as v
from .errors import InvalidInputError, RecoverableDispatchInventoryError
from .evidence import ConnectorIdentity, ProcessIdentity
from .states import SEAT_PHASES, PromptChannel, RequestState
from .values import DispatchProcessIdentity, DispatchRecord, LeaseFence, RecoverableDispatch, RecoverableQueuedOwner

_RECORD_KEYS = frozenset({"requestId", "leaseId", "generation", "ownerInstanceId", "processIdentity", "promptChannel"})


def _connector(owner: Any, created_at: Any, values: Sequence[Any]) -> ConnectorIdentity:
    boot_id, pid, ticks, namespace, ppid, pgrp, session = values
    return ConnectorIdentity(
        owner_instance_id=v.owner_instance_id(owner),
        created_at=created_at,
        process=_process(boot_id, pid, ticks, namespace, ppid, pgrp, session),
    )


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


def dispatch_from_row(row: Sequence[Any]) -> RecoverableDispatch:
    """One ``LIST_DISPATCHES`` row as a :class:`RecoverableDispatch`."""
    try:
        return _dispatch(row)
    except (InvalidInputError, TypeError, ValueError):
        raise RecoverableDispatchInventoryError() from None


def _dispatch(row: Sequence[Any]) -> RecoverableDispatch:
    (lease_id, lease_request_id, generation, owner, phase, heartbeat_at, request_id, session_id, provider, model,
     request_state, request_generation, enqueued_at, identity_lease_id) = row[:14]
    identity, host_id = row[14:34], row[34]
    request_id = v.identifier(request_id, "recoverable dispatch request ID")
    v.identifier(lease_request_id, "recoverable dispatch lease request ID")
    fence = LeaseFence(
        v.identifier(lease_id, "recoverable dispatch lease ID"),
        v.positive_integer(generation, "recoverable dispatch lease generation"),
        v.identifier(owner, "recoverable dispatch lease owner"),
    )
    v.positive_integer(request_generation, "recoverable dispatch request lease generation")
    lease_phase = _state(phase)
    state = _state(request_state)
    v.timestamp(heartbeat_at, "recoverable dispatch heartbeat")
    v.timestamp(enqueued_at, "recoverable dispatch enqueue timestamp")
    if lease_request_id != request_id or request_generation != fence.generation:
        raise InvalidInputError("lease/request fence mismatch")
    process_identity = _dispatch_identity(identity_lease_id, identity, request_id, fence)
    if process_identity is not None and lease_phase in (RequestState.ADMITTED, RequestState.STARTING):
        raise InvalidInputError("process identity predates dispatch intent")
    if lease_phase not in SEAT_PHASES or state != lease_phase:
        raise InvalidInputError("nonterminal lease/request state mismatch")
    return RecoverableDispatch(
        request_id=request_id,
        session_id=v.identifier(session_id, "recoverable dispatch session ID"),
        provider=v.identifier(provider, "recoverable dispatch provider"),
        model=v.identifier(model, "recoverable dispatch model"),
        fence=fence,
        phase=lease_phase,
        heartbeat_at=heartbeat_at,
        process_identity=process_identity,
        host_id=None if process_identity is None else _host(host_id),
    )


def _dispatch_identity(
    identity_lease_id: Any, identity: Sequence[Any], request_id: str, fence: LeaseFence
) -> DispatchProcessIdentity | None:
    values = (identity_lease_id, *identity)
    if all(value is None for value in values):
        return None
    if any(value is None for value in values):
        raise InvalidInputError("partial process identity")
    (identity_request_id, identity_generation, identity_owner, channel, connector_owner, created_at) = identity[:6]
    if (
        identity_lease_id != fence.lease_id
        or identity_request_id != request_id
        or identity_generation != fence.generation
        or identity_owner != fence.owner_instance_id
    ):
        raise InvalidInputError("process identity fence mismatch")
    try:
        prompt_channel = PromptChannel(channel)
    except ValueError:
        raise InvalidInputError("process identity prompt channel is invalid") from None
    connector = _connector(connector_owner, created_at, identity[6:13])
    if connector.owner_instance_id != fence.owner_instance_id:
        raise InvalidInputError("connector process identity owner mismatch")
    child = _process(*identity[13:20])
    return DispatchProcessIdentity(prompt_channel=prompt_channel, connector=connector, child=child)


def _host(value: Any) -> str | None:
    return None if value is None else v.identifier(value, "recorded host ID")


def queued_owner_from_row(row: Sequence[Any]) -> RecoverableQueuedOwner:
    """One ``LIST_QUEUED_OWNERS`` row as a :class:`RecoverableQueuedOwner`."""
    try:
        request_id = v.identifier(row[0], "recoverable queued-owner request ID")
        return RecoverableQueuedOwner(
            request_id=request_id, owner=_connector(row[1], row[2], row[3:10]), host_id=_host(row[10])
        )
    except (InvalidInputError, TypeError, ValueError):
        raise RecoverableDispatchInventoryError() from None


def dispatch_record_from_mapping(value: object) -> DispatchRecord:
    """The seed's camelCase dispatch record (exact keys at every level) as a :class:`DispatchRecord`."""
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
