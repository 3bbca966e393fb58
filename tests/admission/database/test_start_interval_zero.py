"""With no start interval (``min_start_interval_ms=0``) there is nothing to space out.

A connector reads its clock before it waits for the write lock, so another connector's
reservation or start, committed meanwhile, may carry a later stamp than the ``now`` it admits
with. With an interval that later stamp holds the admission back until the interval has passed
it; with none it must hold nothing back (as ``mark_starting`` already does not refuse a start
stamped before another's). Checked on both dialects.
"""

from __future__ import annotations

from planes import PlaneFactory, enqueue

from admission_plane import Policy

NO_INTERVAL = Policy(4, 4, 0, 1_800_000, 30_000)
INTERVAL = Policy(4, 4, 2_000, 1_800_000, 30_000)


def test_a_reservation_stamped_after_the_callers_clock_holds_nothing_back(make_plane: PlaneFactory) -> None:
    """A request admitted at 5 000 does not hold back one admitted at 4 990 (no interval)."""
    plane = make_plane(policy=NO_INTERVAL)
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "later-clock", "agent-a", 1_000)
    enqueue(plane, "earlier-clock", "agent-b", 1_001)
    assert plane.admit_request("later-clock", 5_000, owner) is not None
    lease = plane.admit_request("earlier-clock", 4_990, owner)
    assert lease is not None
    assert lease.request_id == "earlier-clock"


def test_a_start_stamped_after_the_callers_clock_holds_nothing_back(make_plane: PlaneFactory) -> None:
    """A start recorded at 6 000 does not hold back an admission at 5 500 (no interval)."""
    plane = make_plane(policy=NO_INTERVAL)
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "started", "agent-a", 1_000)
    enqueue(plane, "next", "agent-b", 1_001)
    first = plane.admit_request("started", 2_000, owner)
    assert first is not None
    plane.mark_starting(first, 6_000)
    lease = plane.admit_request("next", 5_500, owner)
    assert lease is not None
    assert lease.request_id == "next"


def test_with_an_interval_a_later_reservation_still_holds_the_admission_back(make_plane: PlaneFactory) -> None:
    """With a 2 s interval, the reservation at 5 000 holds back an admission at 4 990 and at 6 999, not at 7 000."""
    plane = make_plane(policy=INTERVAL)
    owner = plane.owner_identity.owner_instance_id
    enqueue(plane, "first", "agent-a", 1_000)
    enqueue(plane, "second", "agent-b", 1_001)
    assert plane.admit_request("first", 5_000, owner) is not None
    assert plane.admit_request("second", 4_990, owner) is None
    assert plane.admit_request("second", 6_999, owner) is None
    assert plane.admit_request("second", 7_000, owner) is not None
