"""The runtime reaper: evidence-only recovery of seats held by crashed connectors.

A stale heartbeat (over :data:`HEARTBEAT_STALE_MS`) can only mark a lease suspect. A seat
is released only on Linux process evidence:

* after the dispatch intent, when the connector, the dispatch child and the child's whole
  process group are all proved gone; the request then ends ``recovery_required``;
* before it (``admitted``, ``starting``: no prompt can have been written yet), when the
  connector holding the lease is proved gone; the request then ends ``cancelled``. The
  holder is the identity its owner instance recorded when it enqueued or admitted. Beyond
  the seed, which keeps such seats forever.

The payload is deleted either way. Anything unverifiable is retained; nothing is ever
requeued.

The inventory is read row by row: a row that does not validate (written by an older
connector, or changed behind the plane's back) is journalled without identifiers, counted
in :attr:`ReaperSummary.untrusted` and left exactly as it is, and every other row is still
judged.

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
from .service import MAX_UNTRUSTED_ROWS, AdmissionService
from .states import OWNER_DEATH_PHASES, SuspectReason
from .values import LeaseHolder, ReaperSummary, RecoverableDispatch

HEARTBEAT_STALE_MS = 4_000
_GONE = frozenset({Observation.GONE, Observation.PID_REUSED})
Counts = dict[str, int]
#: How a pass applies one fenced operation: :func:`_attempt` runs it, :func:`_pretend` (a dry run) does not.
Attempt = Callable[..., bool]


def is_heartbeat_stale(heartbeat_at: int, now: int) -> bool:
    """Strictly older than :data:`HEARTBEAT_STALE_MS`."""
    return now - heartbeat_at > HEARTBEAT_STALE_MS


def reap(
    plane: AdmissionService, now: int, readers: ProcReaders | None = None, *, dry_run: bool = False
) -> ReaperSummary:
    """One pass over queued owners and seat-holding leases; see the module docstring.

    Never raises for one row: an untrusted row is reported and retained, and a failure on
    one lease retains it. With ``dry_run=True`` the pass reads the same inventory and judges
    the same evidence but changes nothing (no write, no journal event): the summary counts
    what the pass would do if every fenced operation took effect.
    """
    _try = _pretend if dry_run else _attempt
    v.timestamp(now, "runtime reaper timestamp")
    if readers is None:
        readers = LIVE_READERS
    v.proc_readers(readers)
    process_ids = read_process_ids(readers)
    inventory = plane.read_recovery_inventory()
    for first in range(0, inventory.untrusted, MAX_UNTRUSTED_ROWS):  # one call journals at most that many
        _try(plane.record_untrusted_recovery_rows, min(MAX_UNTRUSTED_ROWS, inventory.untrusted - first), now)
    counts = {"released": 0, "retained": 0, "marked_recovery_required": 0, "suspected": 0, "queued_settled": 0}

    for queued in inventory.queued_owners:
        if not _is_local(plane, queued.host_id):
            continue
        if observe(queued.owner, readers) in _GONE and _try(
            plane.settle_queued_owner_death, queued.request_id, queued.owner.owner_instance_id, now
        ):
            counts["queued_settled"] += 1

    holders = {holder.request_id: holder for holder in inventory.holders}
    for dispatch in inventory.dispatches:
        if dispatch.process_identity is None and dispatch.phase in OWNER_DEATH_PHASES:
            _judge_before_dispatch(plane, dispatch, holders.get(dispatch.request_id), now, readers, counts, _try)
        else:
            _judge_dispatch(plane, dispatch, now, readers, process_ids, counts, _try)
    return ReaperSummary(inspected=len(inventory.dispatches), untrusted=inventory.untrusted, **counts)


def _judge_dispatch(
    plane: AdmissionService,
    dispatch: RecoverableDispatch,
    now: int,
    readers: ProcReaders,
    process_ids: tuple[int, ...] | None,
    counts: Counts,
    _try: Attempt,
) -> None:
    """A lease at or after its dispatch intent: connector, child and group must all be proved gone."""
    identity = dispatch.process_identity
    evidence_missing = identity is None or process_ids is None
    if is_heartbeat_stale(dispatch.heartbeat_at, now) or evidence_missing:
        reason = SuspectReason.IDENTITY_UNVERIFIABLE if evidence_missing else SuspectReason.HEARTBEAT_EXPIRED
        if _try(plane.mark_suspect, dispatch.fence, now, reason):
            counts["suspected"] += 1
    if identity is None or process_ids is None:
        counts["retained"] += 1
        return
    if not _is_local(plane, dispatch.host_id):
        # Another host's evidence proves nothing here (a different boot id is not death);
        # a stale heartbeat was marked suspect above.
        counts["retained"] += 1
        return
    connector = observe(identity.connector, readers)
    child = observe(identity.child, readers)
    residue = inspect_process_group(identity.child, process_ids, readers)
    if connector in _GONE and child in _GONE and residue is GroupResidue.EMPTY:
        counts["released" if _try(plane.release_exited_recovery_seat, dispatch.fence, now) else "retained"] += 1
        return
    if Observation.UNVERIFIABLE in (connector, child) or residue is GroupResidue.UNVERIFIABLE:
        if _try(plane.mark_suspect, dispatch.fence, now, SuspectReason.IDENTITY_UNVERIFIABLE):
            counts["suspected"] += 1
        counts["retained"] += 1
        return
    if connector is not Observation.SAME and _try(plane.mark_execution_recovery_required, dispatch.fence, now):
        counts["marked_recovery_required"] += 1
    counts["retained"] += 1


def _judge_before_dispatch(
    plane: AdmissionService,
    dispatch: RecoverableDispatch,
    holder: LeaseHolder | None,
    now: int,
    readers: ProcReaders,
    counts: Counts,
    _try: Attempt,
) -> None:
    """An ``admitted`` or ``starting`` lease: no prompt can have been written, so its holder's death ends it.

    The holder is the connector identity recorded for the lease's own owner instance (not
    the connector that enqueued the request, which may be another). Without one, or with
    evidence that cannot be read, the lease is retained as unverifiable; another host's
    holder is never judged here.
    """
    if holder is not None and holder.owner.owner_instance_id != dispatch.fence.owner_instance_id:
        holder = None
    seen = None
    if holder is not None and _is_local(plane, holder.host_id):
        seen = observe(holder.owner, readers)
    if holder is None or seen is Observation.UNVERIFIABLE:
        if _try(plane.mark_suspect, dispatch.fence, now, SuspectReason.IDENTITY_UNVERIFIABLE):
            counts["suspected"] += 1
    elif is_heartbeat_stale(dispatch.heartbeat_at, now) and _try(
        plane.mark_suspect, dispatch.fence, now, SuspectReason.HEARTBEAT_EXPIRED
    ):
        counts["suspected"] += 1
    if seen in _GONE and _try(plane.settle_lease_owner_death, dispatch.fence, now):
        counts["released"] += 1
    else:
        counts["retained"] += 1


def _is_local(plane: AdmissionService, host_id: str | None) -> bool:
    """Evidence recorded by this host (or before host ids were recorded, by a single-host connector)."""
    return host_id is None or host_id == plane.host_id


def _attempt(operation: Callable[..., object], *args: Any) -> bool:
    """Run one fenced operation: whether it took effect (it fails, or returns ``False``, when a
    concurrent owner moved the lease or the request)."""
    try:
        return operation(*args) is not False
    except AdmissionError:
        return False


def _pretend(operation: Callable[..., object], *args: Any) -> bool:
    """A dry run's operation: nothing is called, and it counts as having taken effect."""
    return True
