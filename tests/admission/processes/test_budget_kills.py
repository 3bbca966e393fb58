"""Budget reservations survive SIGKILL: a real connector process drives one budgeted turn to a lifecycle point and is
SIGKILLed there; a reaper pass (in the test process, with this host's ``/proc``) then leaves the budget consistent.

What "consistent" means, checked after every reaper pass (:func:`assert_consistent`):

* the sums add up: every window of ``budget_status`` is the sum of the ``budget_charges`` rows in it, reservations
  (``reserved``, ``retained``) by their estimate and settled charges (``reconciled``, ``charged``) by what they used;
* every charge row is a request that was admitted, in the state its request's fate requires: ``reserved`` while it
  holds a seat, ``retained`` once a ``recovery_required`` turn's seat is released, ``reconciled``/``charged`` once it
  ended after its dispatch, and no row once it ended before any prompt was written (``refunded``);
* the journal's budget events match the rows: one ``budget_reserved`` per admitted budgeted request, one
  ``budget_settled`` to the row's state (``refunded``: no row) once its seat was freed, none while it is held.

A live connector (the test process) holds one reservation and has settled another beside the killed one, so the sums
cover several rows and the reaper is seen to leave a live owner's reservation alone.

This file is also the killed connector: ``python test_budget_kills.py <db> <point> <request-id> <policy-json>`` (see
:func:`run_connector`).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbutil import query, scalar
from journal_replay import read_journal, replay
from planes import CONTENT_KEY, ENCRYPTION_KEY
from workers import (
    REPO_ROOT,
    WorkerProcess,
    dispatch_record,
    group_members,
    kill_group_and_wait,
    set_child_subreaper,
    spawn_child_group,
    turn_fields,
    wall_ms,
)

from admission_plane import AdmissionPlane, Budget, LiveTurnCompletion, LiveTurnFailure, Policy, ReaperSummary, Usage
from admission_plane.states import TERMINAL_STATES, EventKind

pytestmark = pytest.mark.slow

PROVIDER, MODEL = "antigravity", "model-a"  # the key of workers.turn_fields
POLICY = Policy(
    3,
    3,
    0,
    1_800_000,
    30_000,
    budgets=(
        Budget(PROVIDER, MODEL, window_ms=600_000, max_requests=5, max_tokens=10_000),
        Budget(PROVIDER, None, window_ms=60_000, max_requests=8, max_tokens=20_000),
    ),
)
#: The killed connector's estimate, and the usage it reports when it completes with usage (more than it estimated).
ESTIMATE = 1_234
USED = Usage(input_tokens=1_000, output_tokens=500)
#: Where the connector is killed: before admission, at each seat phase, and after its completion call returned.
POINTS = ("queued", "admitted", "starting", "dispatch_intent", "active", "completed", "completed_without_usage")
#: Past the reaper's heartbeat staleness (4 s), so every suspicion the reaper may have is acted on.
LATER_MS = 10_000


# --- the connector (runs in its own process and is SIGKILLed) ----------------------------------------------


def run_connector(database: str, point: str, request_id: str, policy_json: str) -> None:
    """Enqueue one budgeted turn, drive it to ``point`` (a live child group from the dispatch intent on), print
    ``ready``, and wait to be killed."""
    if point not in POINTS:
        raise SystemExit(f"unknown point {point!r}")
    plane = AdmissionPlane(
        database,
        policy=Policy.from_json(policy_json),
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
    )
    owner = plane.owner_identity.owner_instance_id
    plane.enqueue_with_payload(**turn_fields(request_id, "agent-killed", MODEL), estimated_tokens=ESTIMATE)
    ready: dict[str, Any] = {"event": "ready", "pid": os.getpid(), "child_pid": None}
    if point != "queued":
        lease = plane.admit_request(request_id, wall_ms(), owner)
        if lease is None:
            raise SystemExit("the connector could not admit its request")
        if point != "admitted":
            plane.mark_starting(lease, wall_ms())
        if point not in ("admitted", "starting"):
            # The group outlives its leader: the seat stays held until the whole group is gone.
            child = spawn_child_group(("sh", "-c", "sleep 600 & wait"))
            ready["child_pid"] = child.pid
            result = plane.commit_dispatch_intent(dispatch_record(plane, lease, child.pid))
            if not result.ok:
                raise SystemExit(f"dispatch intent failed: {result}")
        if point not in ("admitted", "starting", "dispatch_intent"):
            plane.read_payload(request_id, wall_ms())
            plane.mark_active(lease, wall_ms())
        if point == "completed":
            plane.complete_live_turn(lease, wall_ms(), LiveTurnCompletion("completed", usage=USED))
        elif point == "completed_without_usage":
            plane.complete_live_turn(lease, wall_ms(), LiveTurnCompletion("failed", LiveTurnFailure("timeout")))
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    while True:
        time.sleep(60)


# --- the test side -------------------------------------------------------------------------------------------


class Connector(WorkerProcess):
    """A :class:`WorkerProcess` running this file's :func:`run_connector`."""

    def __init__(self, *args: str) -> None:
        self.args = ("budget-connector", *args)
        path = os.pathsep.join([REPO_ROOT, str(Path(__file__).resolve().parent.parent)])
        self.popen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.popen.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.popen.stderr, self._stderr.append), daemon=True).start()


class Connectors:
    """The connectors a test starts and the child groups they spawned; all killed at teardown."""

    def __init__(self) -> None:
        self.started: list[Connector] = []
        self.groups: list[int] = []

    def drive_to(self, database: str, point: str, request_id: str) -> tuple[Connector, dict[str, Any]]:
        connector = Connector(database, point, request_id, json.dumps(POLICY.to_json()))
        self.started.append(connector)
        ready = connector.read(timeout=120)
        assert ready["event"] == "ready", ready
        if ready["child_pid"] is not None:
            self.groups.append(ready["child_pid"])
        return connector, ready

    def close(self) -> None:
        for connector in self.started:
            connector.kill()
        for pgid in self.groups:
            with contextlib.suppress(RuntimeError):
                kill_group_and_wait(pgid)


@pytest.fixture
def connectors() -> Iterator[Connectors]:
    """Adopt orphaned descendants (killed connectors' children) for the test and kill everything afterwards."""
    set_child_subreaper(True)
    started = Connectors()
    try:
        yield started
    finally:
        try:
            started.close()
        finally:
            set_child_subreaper(False)


#: How each seat-freeing event (by the request's state after it; ``*``: any) leaves the request's reservation.
SEAT_FREEING: dict[str, dict[str, tuple[str, None]]] = {
    EventKind.REQUEST_RELEASED: {"*": ("settled", None)},
    EventKind.REQUEST_ABANDONED: {"*": ("refunded", None)},
    EventKind.LEASE_OWNER_DEAD: {"*": ("refunded", None)},
    EventKind.REQUEST_RECOVERY_SEAT_RELEASED: {"*": ("retained", None)},
    EventKind.OPERATOR_SEAT_RELEASED: {"cancelled": ("refunded", None), "recovery_required": ("retained", None)},
}
CHARGE_COLUMNS = "charge_id, provider, model, charged_at, requests, reserved_tokens, used_tokens, state"


def charges(database: str) -> dict[str, dict[str, Any]]:
    """Every ``budget_charges`` row by charge id."""
    names = [name.strip() for name in CHARGE_COLUMNS.split(",")]
    return {
        row[0]: dict(zip(names, row, strict=True))
        for row in query(database, f"SELECT {CHARGE_COLUMNS} FROM budget_charges")
    }


def assert_consistent(database: str, plane: AdmissionPlane, now: int) -> None:
    """The budget's three records agree: ``budget_status``, the charge rows, the requests and the journal."""
    rows = charges(database)
    # 1. The sums add up, window by window, from the rows by state.
    for window in plane.budget_status(now=now):
        inside = [
            row
            for row in rows.values()
            if row["provider"] == window.provider
            and (window.model is None or row["model"] == window.model)
            and row["charged_at"] > now - window.window_ms
        ]
        by_state: dict[str, Counter[str]] = {}
        for row in inside:
            sums = by_state.setdefault(row["state"], Counter())
            sums["requests"] += row["requests"]
            sums["reserved"] += row["reserved_tokens"]
            sums["used"] += row["used_tokens"] or 0
        total = sum(by_state.values(), Counter())
        held = by_state.get("reserved", Counter()) + by_state.get("retained", Counter())
        spent = by_state.get("reconciled", Counter()) + by_state.get("charged", Counter())
        assert set(by_state) <= {"reserved", "retained", "reconciled", "charged"}, by_state
        assert (window.requests, window.reserved_tokens, window.used_tokens) == (
            total["requests"],
            held["reserved"],
            spent["used"],
        ), (window, by_state)
        if window.max_tokens is not None:
            assert window.remaining_tokens == max(0, window.max_tokens - held["reserved"] - spent["used"])
    # 2. Every row is an admitted request's, in the state the way its seat was (or was not yet) freed requires.
    states = dict(query(database, "SELECT request_id, state FROM turn_requests"))
    leased = {request_id for (request_id,) in query(database, "SELECT request_id FROM leases")}
    events = list(read_journal(plane))
    request_of = {plane._ctx.keys.correlation(request_id): request_id for request_id in states}
    admitted = {request_of[e.correlation_hmac] for e in events if e.kind == EventKind.REQUEST_ADMITTED}
    assert rows.keys() <= admitted, f"charges without an admitted request: {rows.keys() - admitted}"
    freed = {request_of[e.correlation_hmac]: e for e in events if e.kind in SEAT_FREEING}
    for request_id in admitted:
        row = rows.get(request_id)
        event = freed.get(request_id)
        if event is None:
            expected: tuple[Any, ...] = ("reserved", None)
            assert request_id in leased, f"{request_id} lost its seat without a seat-freeing event"
        else:
            assert request_id not in leased, f"{request_id} holds a seat after {event.kind}"
            expected = SEAT_FREEING[event.kind].get(event.to_state, SEAT_FREEING[event.kind].get("*"))
        found = None if row is None else (row["state"], row["used_tokens"] is not None)
        if expected[0] == "refunded":
            assert found is None, f"{request_id} ended {states[request_id]} before any prompt, but is charged: {row}"
        elif expected[0] == "settled":
            assert found in (("reconciled", True), ("charged", True)), (request_id, states[request_id], row)
            assert states[request_id] in TERMINAL_STATES
        else:
            assert found == (expected[0], False), (request_id, states[request_id], event, row)
        if row is not None:
            assert row["requests"] == 1
    # 3. The journal's budget events match the rows.
    budget_events: dict[str, list[Any]] = {}
    for event in events:
        if event.kind in (EventKind.BUDGET_RESERVED, EventKind.BUDGET_SETTLED):
            budget_events.setdefault(request_of[event.correlation_hmac], []).append(event)
    for request_id in admitted:
        history = [(e.kind, e.from_state, e.to_state) for e in budget_events.get(request_id, [])]
        reserved = ("budget_reserved", "uncharged", "reserved")
        row = rows.get(request_id)
        if row is None:
            assert history == [reserved, ("budget_settled", "reserved", "refunded")], (request_id, history)
        elif row["state"] == "reserved":
            assert history == [reserved], (request_id, history)
        else:
            assert history == [reserved, ("budget_settled", "reserved", row["state"])], (request_id, history)
    assert budget_events.keys() <= admitted
    replayed = replay(e for e in events if not e.kind.startswith("budget_"))
    assert (replayed.requeued, replayed.admitted_twice, replayed.discontinuities) == ((), (), ())


def live_owner_turns(plane: AdmissionPlane) -> int:
    """Two turns of the test's own (live) connector on the same key: one completed with usage, one holding its seat
    (admitted); returns the held one's heartbeat."""
    owner = plane.owner_identity.owner_instance_id
    plane.enqueue_with_payload(**turn_fields("live-done", "agent-live", MODEL), estimated_tokens=300)
    done = plane.admit_request("live-done", wall_ms(), owner)
    assert done is not None
    plane.mark_starting(done, wall_ms())
    plane.mark_dispatch_intent(done, wall_ms())
    plane.mark_active(done, wall_ms())
    plane.complete_live_turn(done, wall_ms(), LiveTurnCompletion("completed", usage=Usage(200, 50)))
    plane.enqueue_with_payload(**turn_fields("live-held", "agent-live", MODEL), estimated_tokens=700)
    now = wall_ms()
    assert plane.admit_request("live-held", now, owner) is not None
    return now


@pytest.mark.parametrize("point", POINTS)
def test_a_connector_killed_at_any_point_leaves_budget_reservations_consistent(
    database_url: str, make_plane: Callable[..., AdmissionPlane], connectors: Connectors, point: str
) -> None:
    """A connector SIGKILLed with its budgeted turn at ``point``, then reaped: a queued request is cancelled and was
    never charged; one killed before its dispatch intent is cancelled and its reservation refunded (no row, a
    ``refunded`` settlement); one killed at or after its dispatch intent keeps its reservation as ``reserved`` while
    its child group holds the seat in ``recovery_required``, then ``retained`` once the group is gone and the seat
    released; a completed one stays settled (``reconciled`` to its usage, or ``charged`` at its estimate). The live
    connector's own reservation is untouched, and after every pass the status, the rows, the requests and the journal
    agree (:func:`assert_consistent`)."""
    plane = make_plane(policy=POLICY)
    held_at = live_owner_turns(plane)
    connector, ready = connectors.drive_to(database_url, point, "killed-turn")
    connector.kill()
    heartbeat = scalar(database_url, "SELECT MAX(heartbeat_at) FROM leases") or held_at
    now = max(heartbeat, scalar(database_url, "SELECT MAX(enqueued_at) FROM turn_requests")) + LATER_MS

    summary = plane.reap_suspects(now)
    assert_consistent(database_url, plane, now)
    rows = charges(database_url)
    assert rows["live-held"]["state"] == "reserved", "the live connector's reservation is left alone"
    assert (rows["live-done"]["state"], rows["live-done"]["used_tokens"]) == ("reconciled", 250)
    state = scalar(database_url, "SELECT state FROM turn_requests WHERE request_id = 'killed-turn'")
    killed = rows.get("killed-turn")
    settled = scalar(database_url, "SELECT COUNT(*) FROM events WHERE kind = 'budget_settled'")
    # The live connector's held turn is inspected (and retained) by every pass.
    if point == "queued":
        assert summary == ReaperSummary(inspected=1, retained=1, suspected=1, queued_settled=1)
        assert (state, killed, settled) == ("cancelled", None, 1)
        assert scalar(database_url, "SELECT COUNT(*) FROM events WHERE kind = 'budget_reserved'") == 2
    elif point in ("admitted", "starting"):
        assert summary == ReaperSummary(inspected=2, released=1, retained=1, suspected=2)
        assert (state, killed, settled) == ("cancelled", None, 2)
    elif point in ("dispatch_intent", "active"):
        assert summary.marked_recovery_required == 1
        assert killed is not None
        assert (state, killed["state"], killed["reserved_tokens"], settled) == (
            "recovery_required",
            "reserved",
            ESTIMATE,
            1,
        )
        assert group_members(ready["child_pid"]), "the child group still holds the seat"
        kill_group_and_wait(ready["child_pid"])
        released = plane.reap_suspects(now + 1)
        assert released.released == 1
        assert_consistent(database_url, plane, now + 1)
        killed = charges(database_url)["killed-turn"]
        state = scalar(database_url, "SELECT state FROM turn_requests WHERE request_id = 'killed-turn'")
        assert (state, killed["state"], killed["reserved_tokens"], killed["used_tokens"]) == (
            "recovery_required",
            "retained",
            ESTIMATE,
            None,
        )
        assert scalar(database_url, "SELECT COUNT(*) FROM leases WHERE request_id = 'killed-turn'") == 0
    else:
        assert summary == ReaperSummary(inspected=1, retained=1, suspected=1)
        expected = ("completed", "reconciled", USED.tokens) if point == "completed" else ("failed", "charged", ESTIMATE)
        assert killed is not None
        assert (state, killed["state"], killed["used_tokens"]) == expected
        assert settled == 2
    assert plane.reap_suspects(now + 2).released == 0, "a later pass changes nothing"
    assert_consistent(database_url, plane, now + 2)


if __name__ == "__main__":
    run_connector(*sys.argv[1:])
