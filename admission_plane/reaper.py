"""The runtime reaper: evidence-only recovery of seats held by crashed connectors.

A stale heartbeat (over :data:`HEARTBEAT_STALE_MS`) can only mark a lease suspect. A seat
is released only when the connector, the dispatch child and the child's whole process
group are all proved gone by Linux process evidence; the request then ends
``recovery_required`` and its payload is deleted. Anything unverifiable is retained.
Nothing is ever requeued.

Evidence is judged only by the host that recorded it: on a plane shared by several hosts a
reaper retains every lease and queued owner whose evidence another host recorded (marking
the lease suspect when its heartbeat is stale), because a different boot id there is not
proof of death.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _validate as v
from .errors import AdmissionError
from .evidence import (
    LIVE_READERS,
    GroupResidue,
    Observation,
    ProcReaders,
    inspect_process_group,
    observe,
    read_process_ids,
)
from .service import AdmissionService
from .states import SuspectReason
from .values import ReaperSummary

HEARTBEAT_STALE_MS = 4_000
_GONE = frozenset({Observation.GONE, Observation.PID_REUSED})


def is_heartbeat_stale(heartbeat_at: int, now: int) -> bool:
    """Strictly older than :data:`HEARTBEAT_STALE_MS`."""
    return now - heartbeat_at > HEARTBEAT_STALE_MS


def reap(plane: AdmissionService, now: int, readers: ProcReaders | None = None) -> ReaperSummary:
    """One pass over queued owners and seat-holding leases; see the module docstring.

    Raises :class:`~admission_plane.errors.RecoverableDispatchInventoryError` if the
    inventory itself cannot be trusted; otherwise a failure on one lease retains it.
    """
    v.timestamp(now, "runtime reaper timestamp")
    if readers is None:
        readers = LIVE_READERS
    process_ids = read_process_ids(readers)
    counts = {"released": 0, "retained": 0, "marked_recovery_required": 0, "suspected": 0, "queued_settled": 0}

    for queued in plane.list_recoverable_queued_owners():
        if not _is_local(plane, queued.host_id):
            continue
        if observe(queued.owner, readers) in _GONE and plane.settle_queued_owner_death(
            queued.request_id, queued.owner.owner_instance_id, now
        ):
            counts["queued_settled"] += 1

    dispatches = plane.list_recoverable_dispatches()
    for dispatch in dispatches:
        identity = dispatch.process_identity
        evidence_missing = identity is None or process_ids is None
        if is_heartbeat_stale(dispatch.heartbeat_at, now) or evidence_missing:
            reason = SuspectReason.IDENTITY_UNVERIFIABLE if evidence_missing else SuspectReason.HEARTBEAT_EXPIRED
            if _try(plane.mark_suspect, dispatch.fence, now, reason):
                counts["suspected"] += 1
        if identity is None or process_ids is None:
            counts["retained"] += 1
            continue
        if not _is_local(plane, dispatch.host_id):
            # Another host's evidence proves nothing here (a different boot id is not death);
            # a stale heartbeat was marked suspect above.
            counts["retained"] += 1
            continue
        connector = observe(identity.connector, readers)
        child = observe(identity.child, readers)
        residue = inspect_process_group(identity.child, process_ids, readers)
        if connector in _GONE and child in _GONE and residue is GroupResidue.EMPTY:
            if _try(plane.release_exited_recovery_seat, dispatch.fence, now):
                counts["released"] += 1
            else:
                counts["retained"] += 1
            continue
        if Observation.UNVERIFIABLE in (connector, child) or residue is GroupResidue.UNVERIFIABLE:
            if _try(plane.mark_suspect, dispatch.fence, now, SuspectReason.IDENTITY_UNVERIFIABLE):
                counts["suspected"] += 1
            counts["retained"] += 1
            continue
        if connector is not Observation.SAME and _try(plane.mark_execution_recovery_required, dispatch.fence, now):
            counts["marked_recovery_required"] += 1
        counts["retained"] += 1
    return ReaperSummary(inspected=len(dispatches), **counts)


def _is_local(plane: AdmissionService, host_id: str | None) -> bool:
    """Evidence recorded by this host (or before host ids were recorded, by a single-host connector)."""
    return host_id is None or host_id == plane.host_id


def _try(operation: Callable[..., object], *args: Any) -> bool:
    """Run one fenced operation: whether it took effect (it fails, or ``mark_suspect`` returns
    ``False``, when a concurrent owner moved the lease)."""
    try:
        return operation(*args) is not False
    except AdmissionError:
        return False
