"""The floor our path is judged against, measured in the same run.

* The same six transactions, the same SQL text and the same transaction shape written
  with the plain ``sqlite3`` module (:mod:`benchmarks._floor`), on the real disk and on
  tmpfs.
* The disk's raw commit rate: the smallest durable WAL transaction with
  ``synchronous=FULL``; six of them per turn give the physical ceiling per database file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from admission_plane.evidence import ProcessIdentity
from admission_plane.store import tx as _sql

from ._floor import FloorConnector, raw_commit, raw_commit_connection
from ._support import (
    FLOOR_TURNS,
    QUICK,
    RAW_COMMITS,
    RESULTS,
    TurnDriver,
    migrated,
    open_plane,
    request_states,
    summary,
)


class _FloorRun:
    def __init__(self, floor: FloorConnector) -> None:
        self.floor = floor
        self.count = 0
        self.times: list[float] = []

    def turn(self) -> None:
        self.count += 1
        start = time.perf_counter()
        self.floor.turn(f"floor-{self.count}", 1_000_000 + 10 * self.count)
        self.times.append(time.perf_counter() - start)


def test_floor_turns(benchmark, storage: tuple[str, Path], child_identity: ProcessIdentity) -> None:
    """The plain-sqlite3 twin of a full turn completes every turn; its rate is the floor."""
    name, folder = storage
    path = migrated(folder / "floor.sqlite")
    with open_plane(path) as plane:
        connector, host_id = plane.owner_identity, plane.host_id
    run = _FloorRun(FloorConnector(path, connector, child_identity, host_id))
    try:
        for _ in range(0 if QUICK else 20):
            run.turn()
        run.times.clear()
        benchmark.pedantic(run.turn, rounds=FLOOR_TURNS, iterations=1)
        while len(run.times) < FLOOR_TURNS:
            run.turn()
    finally:
        run.floor.close()
    assert request_states(path) == {"completed": run.count}
    stats = summary(run.times)
    figures = {
        "turns": stats["count"],
        "turns_per_s_median": 1.0 / stats["median_s"],
        "turns_per_s_total": stats["count"] / sum(run.times),
        "turn_median_us": stats["median_s"] * 1e6,
    }
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("floor", {})[name] = figures


def test_raw_commit_rate(benchmark, storage: tuple[str, Path]) -> None:
    """The raw durable commit rate of the medium (one-row WAL transactions, ``synchronous=FULL``)."""
    name, folder = storage
    connection = raw_commit_connection(folder / "commits.sqlite")
    times: list[float] = []
    counter = iter(range(10**9))

    def commit() -> None:
        start = time.perf_counter()
        raw_commit(connection, next(counter))
        times.append(time.perf_counter() - start)

    try:
        for _ in range(0 if QUICK else 50):
            commit()
        times.clear()
        benchmark.pedantic(commit, rounds=RAW_COMMITS, iterations=1)
        while len(times) < RAW_COMMITS:
            commit()
        rows = connection.execute("SELECT count(*) FROM probe").fetchone()[0]
    finally:
        connection.close()
    assert rows == next(counter)
    stats = summary(times)
    figures = {
        "commits": stats["count"],
        "commits_per_s": 1.0 / stats["median_s"],
        "commit_median_us": stats["median_s"] * 1e6,
        "commits_per_s_total": stats["count"] / sum(times),
    }
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("raw_commit", {})[name] = figures


def _capture_transactions(monkeypatch: pytest.MonkeyPatch, connection: Any, trace: list[str]) -> None:
    """Record BEGIN/COMMIT/ROLLBACK seen by the driver, and statements issued through ``Tx``."""

    def on_sql(sql: str) -> None:
        if sql.split(" ", 1)[0].upper() in {"BEGIN", "COMMIT", "ROLLBACK"}:
            trace.append(sql.upper())

    connection.set_trace_callback(on_sql)
    original = _sql.Tx._run

    def traced(self: Any, statement: Any, params: Any) -> Any:
        trace.append(statement.sql(self.dialect))
        return original(self, statement, params)

    monkeypatch.setattr(_sql.Tx, "_run", traced)


def test_floor_issues_the_service_statements(
    monkeypatch: pytest.MonkeyPatch, disk_dir: Path, child_identity: ProcessIdentity
) -> None:
    """The floor runs exactly the service's statements, in the same transactions, for a steady-state turn."""
    service_path = migrated(disk_dir / "service.sqlite")
    floor_path = migrated(disk_dir / "floor.sqlite")
    with open_plane(service_path) as plane:
        driver = TurnDriver(plane, child_identity, "shape")
        driver.turn()  # the first enqueue also records the queued owner; compare a steady-state turn
        service_trace: list[str] = []
        with plane.engine.connect() as connection:
            dbapi = connection.connection.dbapi_connection
        _capture_transactions(monkeypatch, dbapi, service_trace)
        driver.turn()
        dbapi.set_trace_callback(None)
        monkeypatch.undo()
        connector, host_id = plane.owner_identity, plane.host_id
    floor_trace: list[str] = []
    floor = FloorConnector(floor_path, connector, child_identity, host_id, trace=floor_trace.append)
    try:
        floor.turn("shape-1", 1_000_000)
        floor_trace.clear()
        floor.connection.set_trace_callback(
            lambda sql: floor_trace.append(sql.upper()) if sql.split(" ", 1)[0].upper() in {"BEGIN", "COMMIT"} else None
        )
        floor.turn("shape-2", 1_000_010)
    finally:
        floor.close()
    assert service_trace.count("BEGIN IMMEDIATE") == 6
    assert service_trace.count("COMMIT") == service_trace.count("BEGIN IMMEDIATE") + service_trace.count("BEGIN")
    assert floor_trace == service_trace


def test_paired_lifecycle_and_floor(benchmark, storage: tuple[str, Path], child_identity: ProcessIdentity) -> None:
    """Service turns and floor turns alternate on two files side by side, so both see the same disk and load.

    On a shared, noisy machine the ratio of two benchmarks run minutes apart mostly
    measures the neighbours; alternating one turn of each gives the honest ratio.
    """
    name, folder = storage
    ours_path, floor_path = migrated(folder / "paired-ours.sqlite"), migrated(folder / "paired-floor.sqlite")
    with open_plane(ours_path) as plane:
        driver = TurnDriver(plane, child_identity, f"paired-{name}")
        run = _FloorRun(FloorConnector(floor_path, plane.owner_identity, child_identity, plane.host_id))
        try:

            def pair() -> None:
                driver.turn()
                run.turn()

            for _ in range(0 if QUICK else 20):
                pair()
            driver.turn_times.clear()
            run.times.clear()
            benchmark.pedantic(pair, rounds=FLOOR_TURNS, iterations=1)
            while len(run.times) < FLOOR_TURNS:
                pair()
        finally:
            run.floor.close()
    assert request_states(ours_path) == {"completed": driver.count}
    assert request_states(floor_path) == {"completed": run.count}
    ours, floor = driver.figures(), summary(run.times)
    figures = {
        "turns": floor["count"],
        "ours_turns_per_s_median": ours["turns_per_s_median"],
        "floor_turns_per_s_median": 1.0 / floor["median_s"],
        "ours_turns_per_s_total": ours["turns_per_s_total"],
        "floor_turns_per_s_total": floor["count"] / sum(run.times),
        "ours_op_median_us": ours["op_median_us"],
    }
    figures["ratio_median"] = figures["ours_turns_per_s_median"] / figures["floor_turns_per_s_median"]
    figures["ratio_total"] = figures["ours_turns_per_s_total"] / figures["floor_turns_per_s_total"]
    benchmark.extra_info.update(figures)
    RESULTS.setdefault("paired", {})[name] = figures
