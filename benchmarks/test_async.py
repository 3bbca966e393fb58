"""Many turns waiting in one event loop (asyncio API) against the same turns in threads (sync API).

``ASYNC_TURNS`` turns are started at once against ``ASYNC_POLICY`` (4 seats); each holds its
seat for ``ASYNC_HOLD_MS`` inside its block, so most of them wait most of the time. The
dispatch "child" is this process (``spawn`` returns its pid) and the prompt writer does
nothing: the figures are the plane's, not a provider's. Measured for both:

* event-loop lag (asyncio only): a ticker task asks to wake every 5 ms; how late it woke,
  p50 and p99 (ms);
* CPU seconds of the whole process per turn, and admissions per second (wall clock);
* the most threads alive at once, and the most open file descriptors on the database file
  (SQLite connections).

The quick mode (``BENCH_QUICK=1``) runs a dozen turns and checks only that all complete,
never above the seat limit, without a thread per waiting turn.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from admission_plane import AdmissionPlane, Policy, RequestState
from admission_plane.aio import DEFAULT_WORKERS, AsyncAdmissionPlane, AsyncTurn
from admission_plane.turns import Backoff, Turn

from ._support import QUICK, RESULTS, journal_peaks, migrated, open_plane, request_states

ASYNC_TURNS = 12 if QUICK else 200
ASYNC_HOLD_MS = 5 if QUICK else 20
ASYNC_POLICY = Policy(4, 4, 0, 1_800_000, 30_000)
TICK_S = 0.005
#: The sync API's defaults would poll every 10-250 ms; both APIs get the same back-off.
BACKOFF = Backoff(initial_ms=10, max_ms=250)


def cpu_s() -> float:
    """User plus system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def database_fds(path: Path) -> int:
    """Open file descriptors of this process on the SQLite file itself (one per connection)."""
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}") == os.fspath(path):
                count += 1
        except OSError:
            continue
    return count


class Peaks:
    """The most threads and database connections seen by :meth:`sample`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.threads = 0
        self.connections = 0

    def sample(self) -> None:
        self.threads = max(self.threads, threading.active_count())
        self.connections = max(self.connections, database_fds(self.path))


def turn_options(index: int) -> dict[str, Any]:
    """One turn of its own agent; the dispatch child is this process, the prompt goes nowhere."""
    return {
        "request_id": f"turn-{index}",
        "session_id": "bench",
        "agent_id": f"agent-{index}",
        "provider": "antigravity",
        "model": "model-bench",
        "prompt": f"prompt {index}",
        "spawn": os.getpid,
        "backoff": BACKOFF,
        "heartbeat_interval_ms": 1_000,
    }


def run_asyncio(plane: AdmissionPlane, path: Path) -> dict[str, Any]:
    """Every turn as a task of one event loop; a ticker measures the loop's lag."""
    peaks = Peaks(path)
    lags: list[float] = []

    async def write_nothing(_live: AsyncTurn, _prompt: str) -> None:
        return None

    async def one(aplane: AsyncAdmissionPlane, index: int) -> RequestState | None:
        async with aplane.turn(**turn_options(index), write_prompt=write_nothing) as live:
            await asyncio.sleep(ASYNC_HOLD_MS / 1000)
        return live.state

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            asked = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lags.append((time.perf_counter() - asked - TICK_S) * 1000)
            peaks.sample()

    async def main() -> tuple[list[RequestState | None], float, float, int]:
        async with AsyncAdmissionPlane(plane) as aplane:
            stop = asyncio.Event()
            ticking = asyncio.create_task(ticker(stop))
            cpu0, wall0 = cpu_s(), time.perf_counter()
            states = await asyncio.gather(*(one(aplane, index) for index in range(ASYNC_TURNS)))
            cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
            stop.set()
            await ticking
            return list(states), cpu, wall, aplane.bell.reads

    states, cpu, wall, reads = asyncio.run(main())
    ordered = sorted(lags)
    return {
        **_figures(states, cpu, wall, peaks),
        "loop_lag_p50_ms": statistics.median(ordered),
        "loop_lag_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "loop_lag_max_ms": ordered[-1],
        "doorbell_reads": reads,
        "executor_workers": DEFAULT_WORKERS,
    }


def run_threads(plane: AdmissionPlane, path: Path) -> dict[str, Any]:
    """Every turn in its own thread through the sync ``with plane.turn(...)`` API."""
    peaks = Peaks(path)
    states: list[RequestState | None] = [None] * ASYNC_TURNS
    done = threading.Event()

    def one(index: int) -> None:
        def write_nothing(_live: Turn, _prompt: str) -> None:
            return None

        with plane.turn(**turn_options(index), write_prompt=write_nothing) as live:
            time.sleep(ASYNC_HOLD_MS / 1000)
        states[index] = live.state

    def sampler() -> None:
        while not done.wait(TICK_S):
            peaks.sample()

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=one, args=(index,)) for index in range(ASYNC_TURNS)]
    cpu0, wall0 = cpu_s(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
    done.set()
    watcher.join()
    return _figures(states, cpu, wall, peaks)


def _figures(states: list[RequestState | None], cpu: float, wall: float, peaks: Peaks) -> dict[str, Any]:
    assert states == [RequestState.COMPLETED] * ASYNC_TURNS, "every turn completes"
    return {
        "turns": ASYNC_TURNS,
        "hold_ms": ASYNC_HOLD_MS,
        "seats": ASYNC_POLICY.max_active_turns,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_s_per_turn": cpu / ASYNC_TURNS,
        "admissions_per_s": ASYNC_TURNS / wall,
        "peak_threads": peaks.threads,
        "peak_db_connections": peaks.connections,
    }


RUNNERS: dict[str, Callable[[AdmissionPlane, Path], dict[str, Any]]] = {"asyncio": run_asyncio, "threads": run_threads}


@pytest.mark.parametrize("api", ["asyncio", "threads"])
def test_many_waiting_turns(benchmark, disk_dir: Path, api: str) -> None:
    """All turns complete within the seat limit; the asyncio API uses its executor's threads, not one per turn."""
    path = migrated(disk_dir / f"async-{api}.sqlite")
    figures: dict[str, Any] = {}
    plane = open_plane(path, ASYNC_POLICY)
    try:
        threads_before = threading.active_count()
        benchmark.pedantic(lambda: figures.update(RUNNERS[api](plane, path)), rounds=1, iterations=1)
    finally:
        plane.close()
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("async", {})[api] = figures
    assert request_states(path) == {"completed": ASYNC_TURNS}
    assert journal_peaks(path)["max_seats"] <= ASYNC_POLICY.max_active_turns
    if api == "asyncio":
        # The executor's workers, asyncio's own helper threads and the ticker: never one per turn.
        assert figures["peak_threads"] <= threads_before + DEFAULT_WORKERS + 3
        if not QUICK:
            assert figures["loop_lag_p99_ms"] < 250, "the event loop stays responsive while the turns wait"
    else:
        assert figures["peak_threads"] >= min(ASYNC_TURNS, 2 * DEFAULT_WORKERS)
