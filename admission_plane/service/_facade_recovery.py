"""The façade's recovery operations beyond the seed: what the reaper and the operator use.

:class:`RecoveryOperations` is a base of :class:`~admission_plane.service.AdmissionService`,
kept in its own module so that each façade module stays one job; every method is one call
into its job module, like the rest of the façade.
"""

from __future__ import annotations

from ..values import AdmittedLease, LeaseFence, RecoveryInventory, ReleasedLease
from . import _journal, _lifecycle, _reads
from ._context import PlaneContext


class RecoveryOperations:
    """Recovery row by row, seats of connectors dead before their dispatch intent, the operator's release."""

    _ctx: PlaneContext

    def read_recovery_inventory(self) -> RecoveryInventory:
        """Queued owners, seat-holding leases and pre-dispatch holders, each row validated alone (the reaper's read).

        A row that does not validate is only counted (``untrusted``): unlike
        :meth:`list_recoverable_dispatches`, one bad row never hides the others.
        """
        return _reads.recovery_inventory(self._ctx)

    def record_untrusted_recovery_rows(self, count: int, now: int) -> None:
        """Journal ``count`` (1..1000) identifier-free ``recovery_row_retained`` events; the rows are not touched."""
        _journal.record_untrusted_rows(self._ctx, count, now)

    def settle_lease_owner_death(self, fence: LeaseFence | AdmittedLease, now: int) -> None:
        """Free the seat of an ``admitted`` or ``starting`` lease whose holder was proved gone; the request ends
        ``cancelled`` (no prompt can have been written before the dispatch intent). Refuses any other phase."""
        _lifecycle.settle_owner_death(self._ctx, _lifecycle.fence_of(fence), now)

    def release_lease(self, lease_id: str, now: int) -> ReleasedLease:
        """The operator's lever: free one lease's seat without evidence (a host gone for good, a checked
        ``recovery_required`` seat). The request ends ``cancelled`` before its dispatch intent, else stays
        ``recovery_required`` without a seat; it is never requeued. Journalled as ``operator_seat_released``."""
        return _lifecycle.release_by_operator(self._ctx, lease_id, now)
