"""A SIGKILLed async connector is reaped exactly like a sync one (real processes, live ``/proc`` evidence)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
from dbutil import scalar
from test_crash_recovery import (
    POLICY,
    STALE_MS,
    Processes,
    assert_nothing_requeued_and_no_payload_after_dispatch,
    lease_row,
    payloads,
    state,
    summary,
)
from workers import REPO_ROOT, WorkerProcess, group_members, kill_group_and_wait, kill_pid_and_wait, set_child_subreaper

from admission_plane import AdmissionPlane, Policy
from admission_plane.states import EventKind

pytestmark = pytest.mark.slow


class AsyncConnector(WorkerProcess):
    """``tests.admission.async_worker``: one async turn, killed after its prompt write."""

    def __init__(self, *args: str) -> None:  # the module differs from WorkerProcess's; the protocol is the same
        self.args = ("async-turn", *args)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.admission.async_worker", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.popen.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.popen.stderr, self._stderr.append), daemon=True).start()


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Adopt orphaned descendants for the test (so killed children can be reaped) and kill everything afterwards."""
    set_child_subreaper(True)
    started = Processes()
    try:
        yield started
    finally:
        try:
            started.close()
        finally:
            set_child_subreaper(False)


def test_a_killed_async_connector_is_reaped_like_a_sync_one(
    database_url: str, make_plane: Callable[..., AdmissionPlane], processes: Processes
) -> None:
    """An async connector SIGKILLed after its prompt write keeps its seat as recovery_required while its child
    group lives, and a reaper in another process releases it, without requeueing, once the whole group is gone."""
    plane = make_plane(policy=Policy(*POLICY))
    worker = AsyncConnector(database_url, "crashed-turn", json.dumps(POLICY))
    processes.workers.append(worker)
    ready = worker.read()
    assert ready["event"] == "ready"
    child = ready["child_pid"]
    processes.groups.append(child)
    assert state(database_url, "crashed-turn") == "active"
    worker.kill()
    reap = processes.reaper(database_url)

    heartbeat = lease_row(database_url, "crashed-turn")[1]
    assert reap(heartbeat + 1_000) == summary(inspected=1, retained=1, marked_recovery_required=1)
    assert state(database_url, "crashed-turn") == "recovery_required"
    assert payloads(database_url, "crashed-turn") == 0

    kill_pid_and_wait(child)
    assert group_members(child), "the background sleep of the child's group should still be alive"
    stale = heartbeat + 1_000 + STALE_MS
    assert reap(stale) == summary(inspected=1, retained=1, marked_recovery_required=1, suspected=1)

    kill_group_and_wait(child)
    released = reap(stale + 1)
    assert released["released"] == 1
    assert lease_row(database_url, "crashed-turn") is None
    assert state(database_url, "crashed-turn") == "recovery_required"
    assert scalar(database_url, "SELECT COUNT(*) FROM lease_process_identities") == 0

    kinds = [event.kind for event in plane.read_sanitized_events(limit=1000)]
    assert kinds.count(EventKind.REQUEST_RECOVERY_REQUIRED) == 1
    assert kinds.count(EventKind.REQUEST_RECOVERY_SEAT_RELEASED) == 1
    assert_nothing_requeued_and_no_payload_after_dispatch(database_url, plane)
