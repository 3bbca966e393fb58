"""Admission cost against queue depth: ``admit_next`` and a waiting connector's ``admit_request``.

The queue holds D requests with payloads (D = 100, 1 000, 10 000) from 16 agents in
turn, three of which already hold a seat (an ``active`` turn each), so the admission rule
has to pass over busy agents. The queue is loaded in one transaction through the
service's own ``INSERT`` statements (sealed payloads, journal rows, the admission index;
:mod:`benchmarks._queue`) to keep set-up short. The adversarial queue shapes are in
:mod:`benchmarks.test_depth_adversarial`.

* ``admit_next``: each round admits the head; between rounds (untimed) the lease is
  abandoned and one request is queued at the tail, so the depth stays D.
* ``admit_request``: the connector of the newest request asks for it; the rule picks the
  head, so the answer is ``None`` and nothing changes.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from admission_plane import AdmissionPlane
from admission_plane.service import _admission

from ._queue import Queued, Spec, activate_queued, bulk_queue
from ._support import (
    DEPTH_ROUNDS,
    DEPTHS,
    RESULTS,
    migrated,
    open_plane,
    request_fields,
    summary,
    wall_ms,
)

AGENTS = 16
HELD_SEATS = 3


def _enqueue(plane: AdmissionPlane, request_id: str, agent: int, now: int) -> None:
    plane.enqueue_with_payload(**request_fields(request_id, now, agent_id=f"agent-{agent}"))


def _hold_seat(plane: AdmissionPlane, request_id: str, agent: int, now: int) -> None:
    """Queue, admit and activate one turn of ``agent`` (it keeps its seat)."""
    _enqueue(plane, request_id, agent, now)
    activate_queued(plane, request_id, now)


def _bulk_queue(path: Path, depth: int, start: int, owner_instance_id: str) -> None:
    """Queue ``depth`` requests (agents in turn) in one transaction with the service's statements."""
    items = [
        Queued(f"queued-{index:05d}", Spec(agent=f"agent-{index % AGENTS}"), start + index) for index in range(depth)
    ]
    bulk_queue(path, items, owner_instance_id)


class _Queue:
    """A plane over a queue of constant depth, and the clock its rounds advance."""

    def __init__(self, plane: AdmissionPlane, depth: int, now: int) -> None:
        self.plane, self.depth, self.now = plane, depth, now
        self.owner = plane.owner_identity.owner_instance_id
        self.lease: Any = None
        self.added = 0

    def refill(self) -> None:
        """Untimed: free the last admitted seat and queue one request at the tail."""
        self.now += 1
        if self.lease is not None:
            self.plane.abandon_before_prompt(self.lease, self.now, "cancelled")
            self.lease = None
            self.added += 1
            _enqueue(self.plane, f"tail-{self.added:05d}", self.added % AGENTS, self.now)
        self.now += 1


@pytest.fixture(scope="module", params=DEPTHS, ids=lambda depth: f"D{depth}")
def queue(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Queue]:
    """A migrated database on the real disk with ``HELD_SEATS`` active turns and D queued requests."""
    depth = request.param
    path = migrated(tmp_path_factory.mktemp(f"depth{depth}") / "depth.sqlite")
    start = wall_ms()
    with open_plane(path) as plane:
        for seat in range(HELD_SEATS):
            _hold_seat(plane, f"held-{seat}", seat, start + 10 * seat)
        _bulk_queue(path, depth, start + 100, plane.owner_identity.owner_instance_id)
        yield _Queue(plane, depth, start + 100 + depth + 10)


def _record(operation: str, depth: int, times: list[float], benchmark: Any) -> None:
    stats = summary(times)
    figures = {
        "depth": depth,
        "median_us": stats["median_s"] * 1e6,
        "mean_us": stats["mean_s"] * 1e6,
        "min_us": stats["min_s"] * 1e6,
        "rounds": stats["count"],
    }
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("depth", {}).setdefault(operation, {})[str(depth)] = figures


def test_admit_next_at_depth(benchmark, queue: _Queue) -> None:
    """``admit_next`` admits the oldest request of an idle agent at every depth."""
    times: list[float] = []

    def admit() -> None:
        start = time.perf_counter()
        lease = queue.plane.admit_next(queue.now, queue.owner)
        times.append(time.perf_counter() - start)
        assert lease is not None
        queue.lease = lease

    def setup() -> None:
        queue.refill()

    for _ in range(3):
        setup()
        admit()
    times.clear()
    benchmark.pedantic(admit, setup=setup, rounds=DEPTH_ROUNDS, iterations=1)
    while len(times) < DEPTH_ROUNDS:
        setup()
        admit()
    queue.refill()
    _record("admit_next", queue.depth, times, benchmark)


def _newest_queued(queue: _Queue) -> str:
    with sqlite3.connect(queue.plane.engine.url.database) as connection:
        (newest,) = connection.execute(
            "SELECT request_id FROM turn_requests WHERE state = 'queued' ORDER BY enqueued_at DESC LIMIT 1"
        ).fetchone()
    connection.close()
    return newest


def _time_rounds(benchmark, queue: _Queue, name: str, call: Callable[[], None]) -> None:
    """Three warm-up calls, then ``DEPTH_ROUNDS`` timed ones (through pytest-benchmark when enabled)."""
    times: list[float] = []

    def timed() -> None:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)

    for _ in range(3):
        call()
    benchmark.pedantic(timed, rounds=DEPTH_ROUNDS, iterations=1)
    while len(times) < DEPTH_ROUNDS:
        timed()
    _record(name, queue.depth, times, benchmark)


def test_waiting_admit_request_at_depth(benchmark, queue: _Queue) -> None:
    """A connector whose request is last in the queue is told to wait (``None``) at every depth."""
    newest = _newest_queued(queue)

    def ask() -> None:
        queue.now += 1
        assert queue.plane.admit_request(newest, queue.now, queue.owner) is None

    _time_rounds(benchmark, queue, "admit_request", ask)


def test_waiting_look_at_depth(benchmark, queue: _Queue) -> None:
    """``wait_for_admission``'s own look for the last request: besides "not now", it works out what to wait
    for (a departure from the queue, and a freed seat if its agent holds one), so its cost stays flat too."""
    newest = _newest_queued(queue)

    def look() -> None:
        queue.now += 1
        lease, wake = _admission.admit_request(queue.plane._ctx, newest, queue.now, queue.owner)
        assert lease is None
        assert wake is not None
        assert wake.queue >= 1

    _time_rounds(benchmark, queue, "waiting_look", look)
