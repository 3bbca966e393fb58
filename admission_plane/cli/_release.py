"""``admission-plane release LEASE_ID``: the operator's lever for a seat no evidence can free.

For a lease whose host is gone for good (its evidence is another host's, which the reaper
never judges) or a ``recovery_required`` seat the operator has checked by hand. It asks
for confirmation on a terminal (``--yes`` skips the question; without a terminal and
without ``--yes`` it refuses), then frees the seat in one transaction, journalled as
``operator_seat_released``. The request is never requeued: it ends ``cancelled`` before
its dispatch intent, else stays ``recovery_required`` without a seat.
"""

from __future__ import annotations

import argparse
import sys

from .. import _validate as v
from ._common import EXIT_FOUND_PROBLEM, EXIT_OK, CommandFailed, emit, now_ms, open_plane

_YES = frozenset({"y", "yes"})


def cmd_release(args: argparse.Namespace) -> int:
    """Free one lease's seat on the operator's word (after confirmation)."""
    lease_id = v.identifier(args.lease_id, "lease ID")
    if not args.yes:
        _confirm(lease_id)
    plane = open_plane(args, keys=True)
    try:
        released = plane.release_lease(lease_id, now_ms())
    finally:
        plane.close()
    data = {"lease_id": lease_id, "phase": str(released.phase), "outcome": str(released.outcome)}
    emit(
        args,
        data,
        f"released the seat of lease {lease_id} (it was {released.phase}); "
        f"its request is {released.outcome} and will never be requeued",
    )
    return EXIT_OK


def _confirm(lease_id: str) -> None:
    """Ask on the terminal; refuse without one (a script must say ``--yes``)."""
    if not sys.stdin.isatty():
        raise CommandFailed("stdin is not a terminal to confirm on: pass --yes to release the seat")
    sys.stderr.write(
        f"Release the seat of lease {lease_id} without process evidence? Its request will never run again, "
        "and if its connector or dispatch is in fact still alive the plane will admit one turn too many. [y/N] "
    )
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in _YES:
        raise CommandFailed("release not confirmed; nothing was changed", EXIT_FOUND_PROBLEM)
