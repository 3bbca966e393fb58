"""Lifecycle throughput: full turns through the service, one process, one database file.

One turn is enqueue with payload -> admit -> starting -> dispatch intent with process
identity -> active -> completed: six durable write transactions (``synchronous=FULL``,
WAL). Runs on the real disk and on tmpfs; the per-operation medians go into the
benchmark's ``extra_info`` and the session summary.
"""

from __future__ import annotations

from pathlib import Path

from admission_plane.evidence import ProcessIdentity

from ._support import LIFECYCLE_TURNS, QUICK, RESULTS, TurnDriver, migrated, open_plane, request_states


def test_lifecycle_turns(benchmark, storage: tuple[str, Path], child_identity: ProcessIdentity) -> None:
    """Every turn of the run completes, and the turn rate and per-operation times are recorded."""
    name, folder = storage
    path = migrated(folder / "lifecycle.sqlite")
    with open_plane(path) as plane:
        driver = TurnDriver(plane, child_identity, f"life-{name}")
        for _ in range(0 if QUICK else 20):
            driver.turn()  # warm-up: first connection, statement compilation, page cache
        driver.turn_times.clear()
        for times in driver.op_times.values():
            times.clear()
        benchmark.pedantic(driver.turn, rounds=LIFECYCLE_TURNS, iterations=1)
        while len(driver.turn_times) < LIFECYCLE_TURNS:  # a disabled benchmark runs its target once
            driver.turn()
    assert request_states(path) == {"completed": driver.count}
    figures = driver.figures()
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("lifecycle", {})[name] = figures
