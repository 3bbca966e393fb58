"""Crash safety with real processes: a connector is SIGKILLed at each lifecycle point and a reaper
in another process recovers (or retains) its seat from live ``/proc`` evidence only.

Time is an argument: reaper passes use ``now`` relative to the lease's durable heartbeat, so
staleness never depends on how fast this machine is.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dbutil import query, scalar
from journal_replay import read_journal, replay
from workers import (
    WorkerProcess,
    group_members,
    kill_group_and_wait,
    kill_pid_and_wait,
    set_child_subreaper,
)

from admission_plane import AdmissionPlane, Policy
from admission_plane.states import TERMINAL_STATES, EventKind

pytestmark = pytest.mark.slow

POLICY = (3, 3, 0, 1_800_000, 30_000)
STALE_MS = 4_001


class Processes:
    """Every process a test starts, and every child group it learns of; all killed at teardown."""

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []
        self.groups: list[int] = []

    def start(self, *args: str) -> WorkerProcess:
        worker = WorkerProcess(*args)
        self.workers.append(worker)
        return worker

    def crash_worker(self, database: str, phase: str, request_id: str) -> tuple[WorkerProcess, dict[str, Any]]:
        """A connector that drove ``request_id`` to ``phase`` with a live child group, not yet killed."""
        worker = self.start("crash-at", database, phase, request_id, json.dumps(POLICY))
        ready = worker.read()
        assert ready["event"] == "ready"
        self.groups.append(ready["child_pid"])
        return worker, ready

    def reaper(self, database: str) -> Callable[[int], dict[str, int]]:
        """A reaper process; the returned function runs one pass at ``now`` and returns its summary."""
        worker = self.start("reaper", database, json.dumps(POLICY))
        assert worker.read()["event"] == "ready"

        def reap(now: int) -> dict[str, int]:
            worker.send({"now": now})
            answer = worker.read()
            assert "summary" in answer, answer
            return answer["summary"]

        return reap

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        for pgid in [*self.groups, *_adopted_session_leaders()]:
            with contextlib.suppress(RuntimeError):
                kill_group_and_wait(pgid)


def _adopted_session_leaders() -> list[int]:
    """Orphaned session leaders reparented to this (subreaper) process: children of killed workers."""
    adopted = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and int(fields[3]) == int(entry):
            adopted.append(int(entry))
    return adopted


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


def summary(**counts: int) -> dict[str, int]:
    """A full reaper summary: the given counts, zero elsewhere."""
    fields = (
        "inspected",
        "released",
        "retained",
        "marked_recovery_required",
        "suspected",
        "queued_settled",
        "untrusted",
    )
    return {name: counts.get(name, 0) for name in fields}


def lease_row(database: str, request_id: str) -> tuple[Any, ...] | None:
    """``(phase, heartbeat_at, suspect_since, suspect_reason)`` of the request's lease, if any."""
    rows = query(
        database,
        "SELECT phase, heartbeat_at, suspect_since, suspect_reason FROM leases WHERE request_id = ?",
        (request_id,),
    )
    return rows[0] if rows else None


def payloads(database: str, request_id: str) -> int:
    return scalar(database, "SELECT COUNT(*) FROM turn_payloads WHERE request_id = ?", (request_id,))


def state(database: str, request_id: str) -> str:
    return scalar(database, "SELECT state FROM turn_requests WHERE request_id = ?", (request_id,))


def assert_nothing_requeued_and_no_payload_after_dispatch(database: str, plane: AdmissionPlane) -> None:
    """The journal never returns a request to queued, and no active or terminal request keeps a payload."""
    journal = replay(read_journal(plane))
    assert journal.requeued == ()
    assert journal.admitted_twice == ()
    assert journal.discontinuities == ()
    after_dispatch = sorted({"active", *TERMINAL_STATES})
    marks = ",".join("?" * len(after_dispatch))
    leaked = query(
        database,
        f"SELECT r.request_id, r.state FROM turn_payloads p JOIN turn_requests r USING (request_id) "
        f"WHERE r.state IN ({marks})",
        tuple(after_dispatch),
    )
    assert leaked == []


@pytest.mark.parametrize("phase", ["dispatch_intent", "active"])
def test_a_killed_connector_keeps_its_seat_while_its_child_group_lives_and_frees_it_once_the_group_is_gone(
    database_url: str, make_plane: Callable[..., AdmissionPlane], processes: Processes, phase: str
) -> None:
    """A reaper in another process keeps the seat of a SIGKILLed connector as recovery_required, without payload and
    suspect once stale, while any member of its dispatch child's process group lives, and releases it without requeueing
    only once the whole group is gone."""
    plane = make_plane(policy=Policy(*POLICY))
    worker, ready = processes.crash_worker(database_url, phase, "crashed-turn")
    child = ready["child_pid"]
    worker.kill()
    reap = processes.reaper(database_url)

    heartbeat = lease_row(database_url, "crashed-turn")[1]
    assert reap(heartbeat + 1_000) == summary(inspected=1, retained=1, marked_recovery_required=1)
    assert lease_row(database_url, "crashed-turn") == ("recovery_required", heartbeat + 1_000, None, None)
    assert state(database_url, "crashed-turn") == "recovery_required"
    assert payloads(database_url, "crashed-turn") == 0

    kill_pid_and_wait(child)
    assert group_members(child), "the background sleep of the child's group should still be alive"
    stale = heartbeat + 1_000 + STALE_MS
    assert reap(stale) == summary(inspected=1, retained=1, marked_recovery_required=1, suspected=1)
    assert lease_row(database_url, "crashed-turn") == (
        "recovery_required",
        heartbeat + 1_000,
        stale,
        "heartbeat_expired",
    )

    kill_group_and_wait(child)
    released = reap(stale + 1)
    assert released["released"] == 1
    assert released["retained"] == 0
    assert lease_row(database_url, "crashed-turn") is None
    assert state(database_url, "crashed-turn") == "recovery_required"
    assert payloads(database_url, "crashed-turn") == 0
    assert scalar(database_url, "SELECT COUNT(*) FROM lease_process_identities") == 0
    assert reap(stale + 2) == summary()

    kinds = [event.kind for event in read_journal(plane)]
    assert kinds.count(EventKind.REQUEST_RECOVERY_REQUIRED) == 1
    assert kinds.count(EventKind.REQUEST_RECOVERY_SEAT_RELEASED) == 1
    assert_nothing_requeued_and_no_payload_after_dispatch(database_url, plane)


@pytest.mark.parametrize("phase", ["admitted", "starting"])
def test_a_killed_connector_without_dispatch_evidence_gives_its_seat_back_once_proved_gone(
    database_url: str, make_plane: Callable[..., AdmissionPlane], processes: Processes, phase: str
) -> None:
    """A connector SIGKILLed in admitted or starting recorded no dispatch evidence, but the identity it recorded
    when it enqueued proves it gone: a reaper in another process frees the seat and ends the request cancelled
    (no prompt can have been written; the original connector keeps such seats forever)."""
    plane = make_plane(policy=Policy(*POLICY))
    worker, _ready = processes.crash_worker(database_url, phase, "unproven-turn")
    worker.kill()
    reap = processes.reaper(database_url)

    heartbeat = lease_row(database_url, "unproven-turn")[1]
    assert reap(heartbeat + 10_000) == summary(inspected=1, released=1, suspected=1)
    assert lease_row(database_url, "unproven-turn") is None
    assert state(database_url, "unproven-turn") == "cancelled"
    assert scalar(database_url, "SELECT COUNT(*) FROM events WHERE kind = 'lease_owner_dead'") == 1
    assert reap(heartbeat + 10_001) == summary()
    assert_nothing_requeued_and_no_payload_after_dispatch(database_url, plane)


def test_a_queued_request_of_a_killed_owner_is_cancelled_and_a_live_owners_request_is_left_alone(
    database_url: str, make_plane: Callable[..., AdmissionPlane], processes: Processes
) -> None:
    """The reaper cancels, without payload, the queued request of an owner SIGKILLed while queued and leaves a live
    owner's queued request alone, which is admitted next."""
    plane = make_plane(policy=Policy(*POLICY))
    dead = processes.start("queued", database_url, "dead-owner-turn", json.dumps(POLICY))
    assert dead.read()["event"] == "ready"
    live = processes.start("queued", database_url, "live-owner-turn", json.dumps(POLICY))
    assert live.read()["event"] == "ready"
    dead.kill()
    reap = processes.reaper(database_url)

    now = scalar(database_url, "SELECT MAX(enqueued_at) FROM turn_requests") + 1_000
    assert reap(now) == summary(queued_settled=1)
    assert state(database_url, "dead-owner-turn") == "cancelled"
    assert payloads(database_url, "dead-owner-turn") == 0
    assert (
        scalar(
            database_url,
            "SELECT queued_owner_instance_id IS NOT NULL FROM turn_requests WHERE request_id = 'dead-owner-turn'",
        )
        == 1
    )
    assert state(database_url, "live-owner-turn") == "queued"
    assert payloads(database_url, "live-owner-turn") == 1
    assert reap(now + 1) == summary()

    kinds = [event.kind for event in read_journal(plane)]
    assert kinds.count(EventKind.QUEUED_OWNER_DEAD) == 1
    lease = plane.admit_next(now + 2, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert lease.request_id == "live-owner-turn"
    assert_nothing_requeued_and_no_payload_after_dispatch(database_url, plane)
