"""Named records for the rows the statements return.

Each record's fields are its query's column labels in order (checked where the query is
defined, see :class:`~admission_plane.store.tx.Query`), so a row is built in exactly one
place, :meth:`Tx.one <admission_plane.store.tx.Tx.one>`, and read by name everywhere
else. Values are the driver's, unvalidated: a row read from the database is only trusted
after the service layer checked it.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "Candidate",
    "DispatchRow",
    "EventRow",
    "IdentityRow",
    "LeaseRow",
    "LeaseWithRequestRow",
    "OwnerRow",
    "PayloadRow",
    "PolicyRow",
    "QueuedEntry",
    "QueuedOwnerRow",
    "RequestMeta",
    "RequestRow",
    "RequestStatus",
    "WaiterEntry",
]


@attrs.frozen
class RequestMeta:
    """A request's immutable metadata (what an idempotent enqueue compares)."""

    session_id: Any
    agent_id: Any
    fingerprint: Any
    provider: Any
    model: Any


@attrs.frozen
class RequestRow:
    """A request's metadata, state and enqueue time."""

    request_id: Any
    session_id: Any
    agent_id: Any
    fingerprint: Any
    provider: Any
    model: Any
    state: Any
    enqueued_at: Any


@attrs.frozen
class RequestStatus:
    """A request's state and the connector it is bound to while queued."""

    state: Any
    queued_owner_instance_id: Any


@attrs.frozen
class PayloadRow:
    """A sealed prompt as stored."""

    nonce: Any
    ciphertext: Any
    auth_tag: Any
    key_version: Any
    content_fingerprint: Any
    expires_at: Any


@attrs.frozen
class OwnerRow:
    """A queued owner's recorded connector identity."""

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
class QueuedOwnerRow:
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
class Candidate:
    """The request the admission rule would admit next, and its last lease generation."""

    request_id: Any
    lease_generation: Any


@attrs.frozen
class QueuedEntry:
    """Where a queued request with a payload stands."""

    enqueued_at: Any
    provider: Any
    model: Any


@attrs.frozen
class WaiterEntry:
    """What a waiting connector's look needs to know about its own request."""

    enqueued_at: Any
    agent_id: Any
    provider: Any
    model: Any


@attrs.frozen
class LeaseRow:
    """A lease's fence and phase."""

    lease_id: Any
    request_id: Any
    generation: Any
    owner_instance_id: Any
    phase: Any


@attrs.frozen
class LeaseWithRequestRow:
    """A lease's fence and phase beside its request's state and generation."""

    lease_id: Any
    request_id: Any
    generation: Any
    owner_instance_id: Any
    phase: Any
    request_state: Any
    request_generation: Any


@attrs.frozen
class IdentityRow:
    """The process evidence recorded with a dispatch intent (without its lease id, time and host)."""

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
class DispatchRow:
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
class EventRow:
    """One journal row."""

    event_seq: Any
    kind: Any
    from_state: Any
    to_state: Any
    occurred_at: Any
    correlation_hmac: Any


@attrs.frozen
class PolicyRow:
    """The durable policy row."""

    max_active_turns: Any
    max_concurrent_starts: Any
    min_start_interval_ms: Any
    queue_timeout_ms: Any
    capacity_cooldown_ms: Any
    drain_state: Any
    policy_fingerprint: Any
