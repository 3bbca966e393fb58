"""Two hosts share one plane: each reaper judges only the evidence its own host recorded.

The hosts are simulated: two planes with different ``host_id`` on one database, whose
injected ``/proc`` readers report different boot ids (a real second machine cannot run
here). Runs on SQLite and, when configured, on PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_proc import OWNER_A, OWNER_B, FakeProc, connector, process
from planes import CONTENT_KEY, ENCRYPTION_KEY, enqueue

from admission_plane import AdmissionPlane, DispatchRecord, Policy, RequestState

BOOT_A = "aaaaaaaa-1111-4111-8111-111111111111"
BOOT_B = "bbbbbbbb-2222-4222-8222-222222222222"
POLICY = Policy(3, 2, 0, 1_800_000, 30_000)


@pytest.fixture
def hosts(database_url: str) -> Iterator[tuple[AdmissionPlane, AdmissionPlane]]:
    """Plane A on host-a (connector pid 100, boot A) and plane B on host-b (pid 200, boot B), on one database."""
    planes = [
        AdmissionPlane(
            database_url,
            policy=POLICY,
            encryption_key=ENCRYPTION_KEY,
            content_fingerprint_key=CONTENT_KEY,
            owner_identity=connector(pid, owner, boot_id=boot),
            host_id=host,
        )
        for pid, owner, boot, host in ((100, OWNER_A, BOOT_A, "host-a"), (200, OWNER_B, BOOT_B, "host-b"))
    ]
    try:
        yield planes[0], planes[1]
    finally:
        for plane in planes:
            plane.close()


def dispatch(plane: AdmissionPlane, request_id: str, child_pid: int, boot_id: str, now: int) -> Any:
    """Enqueue, admit, start and commit a dispatch intent with a child on ``boot_id``."""
    enqueue(plane, request_id, agent_id=request_id, now=now)
    owner = plane.owner_identity.owner_instance_id
    lease = plane.admit_request(request_id, now, owner)
    assert lease is not None
    plane.mark_starting(lease, now)
    record = DispatchRecord(
        request_id=request_id,
        lease_id=lease.lease_id,
        generation=lease.generation,
        owner_instance_id=owner,
        connector=plane.owner_identity,
        child=process(child_pid, boot_id=boot_id),
        prompt_channel="stdin",
    )
    assert plane.commit_dispatch_intent(record).ok
    return lease


def test_reaper_leaves_another_hosts_leases_alone_and_releases_its_own_dead_ones(hosts) -> None:
    """Host B's reaper releases its own proven-dead lease and retains host A's, never marking it recovery_required."""
    plane_a, plane_b = hosts
    now = int(time.time() * 1000)
    dispatch(plane_a, "r-a", 101, BOOT_A, now)
    dispatch(plane_b, "r-b", 201, BOOT_B, now)
    nothing_alive_on_b = FakeProc(boot_id=BOOT_B + "\n", pids=[])

    summary = plane_b.reap_suspects(now + 10_000, nothing_alive_on_b)

    assert (summary.released, summary.retained, summary.marked_recovery_required) == (1, 1, 0)
    assert plane_b.get_request("r-b").state is RequestState.RECOVERY_REQUIRED
    assert plane_a.get_request("r-a").state is RequestState.DISPATCH_INTENT
    remaining = plane_a.list_recoverable_dispatches()
    assert [(item.request_id, item.host_id) for item in remaining] == [("r-a", "host-a")]


def test_another_hosts_stale_lease_is_marked_suspect_but_kept(hosts) -> None:
    """A foreign lease whose heartbeat is stale is marked heartbeat_expired and keeps its seat."""
    plane_a, plane_b = hosts
    now = int(time.time() * 1000)
    dispatch(plane_a, "r-a", 101, BOOT_A, now)

    summary = plane_b.reap_suspects(now + 10_000, FakeProc(boot_id=BOOT_B + "\n", pids=[]))

    assert (summary.suspected, summary.retained, summary.released) == (1, 1, 0)
    (lease,) = plane_a.list_recoverable_dispatches()
    assert lease.phase is RequestState.DISPATCH_INTENT


def test_own_host_evidence_from_an_earlier_boot_is_released_as_a_reboot(hosts) -> None:
    """On the recording host a different boot id is a reboot: the old processes are gone and the seat is freed."""
    plane_a, _ = hosts
    now = int(time.time() * 1000)
    dispatch(plane_a, "r-a", 101, BOOT_A, now)

    summary = plane_a.reap_suspects(now + 10_000, FakeProc(boot_id=BOOT_B + "\n", pids=[]))

    assert summary.released == 1
    assert plane_a.get_request("r-a").state is RequestState.RECOVERY_REQUIRED


def test_reaper_skips_queued_requests_of_another_hosts_owner(hosts) -> None:
    """A queued request enqueued on host A is not settled by host B's reaper, whose /proc cannot see A's owner."""
    plane_a, plane_b = hosts
    now = int(time.time() * 1000)
    enqueue(plane_a, "queued-on-a", now=now)
    enqueue(plane_b, "queued-on-b", now=now)

    summary = plane_b.reap_suspects(now, FakeProc(boot_id=BOOT_B + "\n", pids=[]))

    assert summary.queued_settled == 1
    assert plane_a.get_request("queued-on-a").state is RequestState.QUEUED
    assert plane_b.get_request("queued-on-b").state is RequestState.CANCELLED


def test_a_live_foreign_lease_is_judged_by_its_own_host(hosts) -> None:
    """Host A's reaper, seeing its connector and child alive, retains its lease without suspicion."""
    plane_a, _ = hosts
    now = int(time.time() * 1000)
    dispatch(plane_a, "r-a", 101, BOOT_A, now)
    alive_on_a = FakeProc(boot_id=BOOT_A + "\n").alive(plane_a.owner_identity, process(101, boot_id=BOOT_A))

    summary = plane_a.reap_suspects(now, alive_on_a)

    assert (summary.released, summary.retained, summary.suspected, summary.marked_recovery_required) == (0, 1, 0, 0)
