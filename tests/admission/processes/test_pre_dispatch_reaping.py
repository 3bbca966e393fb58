"""Seats of connectors SIGKILLed before their dispatch intent come back on live ``/proc`` evidence.

Real connector processes (``workers.py crash-at``) enqueue, get admitted (and mark starting),
then are SIGKILLed; the reaper pass runs in the test process with this host's ``/proc``.
No prompt can have been written before the dispatch intent, so a proved-gone holder frees
the seat and the request ends ``cancelled``; a live holder keeps it. Time is an argument:
reaper passes use ``now`` relative to the lease's durable heartbeat.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dbutil import query, scalar
from journal_replay import read_journal, replay
from workers import WorkerProcess, group_members, kill_group_and_wait, set_child_subreaper

from admission_plane import AdmissionPlane, Policy, ReaperSummary
from admission_plane.states import EventKind

pytestmark = pytest.mark.slow

POLICY = (3, 3, 0, 1_800_000, 30_000)


class Connectors:
    """The connector workers a test starts and the child groups they spawned; all killed at teardown."""

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []
        self.groups: list[int] = []

    def drive_to(self, database: str, phase: str, request_id: str) -> tuple[WorkerProcess, dict[str, Any]]:
        """A connector that enqueued ``request_id`` and drove its lease to ``phase``, still running."""
        worker = WorkerProcess("crash-at", database, phase, request_id, json.dumps(POLICY))
        self.workers.append(worker)
        ready = worker.read()
        assert ready["event"] == "ready"
        self.groups.append(ready["child_pid"])
        return worker, ready

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        for pgid in self.groups:
            with contextlib.suppress(RuntimeError):
                kill_group_and_wait(pgid)


@pytest.fixture
def connectors() -> Iterator[Connectors]:
    """Adopt orphaned descendants (killed workers' children) for the test and kill everything afterwards."""
    set_child_subreaper(True)
    started = Connectors()
    try:
        yield started
    finally:
        try:
            started.close()
        finally:
            set_child_subreaper(False)


def lease_of(database: str, request_id: str) -> tuple[Any, ...] | None:
    """``(phase, heartbeat_at, suspect_since, suspect_reason)`` of the request's lease, if any."""
    rows = query(
        database,
        "SELECT phase, heartbeat_at, suspect_since, suspect_reason FROM leases WHERE request_id = ?",
        (request_id,),
    )
    return rows[0] if rows else None


def state(database: str, request_id: str) -> str:
    return scalar(database, "SELECT state FROM turn_requests WHERE request_id = ?", (request_id,))


@pytest.mark.parametrize("phase", ["admitted", "starting"])
def test_a_connector_killed_before_its_dispatch_intent_gives_its_seat_back(
    database_url: str, make_plane: Callable[..., AdmissionPlane], connectors: Connectors, phase: str
) -> None:
    """A connector SIGKILLed while admitted or starting is proved gone by /proc; one reaper pass frees its seat and
    ends the request cancelled, payload deleted, never requeued, even though its idle child group still runs."""
    plane = make_plane(policy=Policy(*POLICY))
    worker, ready = connectors.drive_to(database_url, phase, "killed-turn")
    heartbeat = lease_of(database_url, "killed-turn")[1]  # type: ignore[index]
    worker.kill()

    assert plane.reap_suspects(heartbeat + 1_000) == ReaperSummary(inspected=1, released=1)

    assert lease_of(database_url, "killed-turn") is None
    assert state(database_url, "killed-turn") == "cancelled"
    assert scalar(database_url, "SELECT COUNT(*) FROM turn_payloads") == 0
    assert group_members(ready["child_pid"]), "the never-prompted child group is not what holds the seat"
    assert plane.reap_suspects(heartbeat + 1_001) == ReaperSummary()
    journal = list(read_journal(plane))
    assert [(e.kind, e.from_state, e.to_state) for e in journal if e.kind == EventKind.LEASE_OWNER_DEAD] == [
        ("lease_owner_dead", phase, "cancelled")
    ]
    replayed = replay(journal)
    assert (replayed.requeued, replayed.admitted_twice, replayed.discontinuities) == ((), (), ())
    assert replayed.final_states == {journal[0].correlation_hmac: "cancelled"}


@pytest.mark.parametrize("phase", ["admitted", "starting"])
def test_a_live_connectors_pre_dispatch_lease_is_retained(
    database_url: str, make_plane: Callable[..., AdmissionPlane], connectors: Connectors, phase: str
) -> None:
    """While the connector process lives its admitted or starting lease is retained (only marked suspect once stale)."""
    plane = make_plane(policy=Policy(*POLICY))
    connectors.drive_to(database_url, phase, "live-turn")
    heartbeat = lease_of(database_url, "live-turn")[1]  # type: ignore[index]

    assert plane.reap_suspects(heartbeat + 1_000) == ReaperSummary(inspected=1, retained=1)
    assert lease_of(database_url, "live-turn") == (phase, heartbeat, None, None)
    stale = heartbeat + 10_000
    assert plane.reap_suspects(stale) == ReaperSummary(inspected=1, retained=1, suspected=1)
    assert lease_of(database_url, "live-turn") == (phase, heartbeat, stale, "heartbeat_expired")
    assert state(database_url, "live-turn") == phase
