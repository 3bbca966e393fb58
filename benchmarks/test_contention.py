"""Dispatch contention: P connector processes on one database for a fixed time.

Each process enqueues its own requests and drives them through the whole lifecycle
(:mod:`benchmarks._contention_worker`), with minimum start interval 0 and either no
hold or a 50 ms hold of each seat while ``active``; a waiting connector polls
``admit_request`` every 1 ms (plus a 5 ms sensitivity case at P = 1 and 8). The policy
has 4 seats, so at P = 8 the seat limit binds. Recorded: total turns/s in the window, errors by kind (raw SQLite
errors reaching a caller, ``transaction_fault`` dispatch intents, retried refusals), and
the most seat-holding and ``active`` leases ever committed at once (journal replay),
which must never exceed the policy.

The PostgreSQL variant runs the same worker at P = 1, 2, 4, 8 (no hold, 1 ms poll) on the
session's fresh PostgreSQL database (``postgres_url`` in ``conftest.py``: created,
migrated, emptied before each case, dropped at the end; skipped without a server).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ._contention_worker import RAW_KINDS
from ._support import (
    CONTENTION_CASES,
    CONTENTION_POLICY,
    CONTENTION_SECONDS,
    PG_CONTENTION_CASES,
    QUICK,
    RESULTS,
    journal_peaks,
    migrated,
    request_states,
    run_together,
)

START_TIMEOUT_S = 120


def _per_unit(reports: list[dict[str, Any]], total: str, units: str) -> float:
    count = sum(report[units] for report in reports)
    return sum(report[total] for report in reports) / count * 1e6 if count else 0.0


def run_contention(path: str | Path, processes: int, hold_ms: int, poll_ms: int = 1) -> dict[str, Any]:
    """Start ``processes`` workers on ``path`` (SQLite file or database URL), release them together, gather figures."""
    arguments = [
        "--database",
        os.fspath(path),
        "--seconds",
        str(CONTENTION_SECONDS),
        "--hold-ms",
        str(hold_ms),
        "--policy",
        json.dumps(list(CONTENTION_POLICY.as_tuple())),
        "--poll-ms",
        str(poll_ms),
    ]
    reports = run_together("benchmarks._contention_worker", arguments, processes, CONTENTION_SECONDS + START_TIMEOUT_S)
    errors: Counter[str] = Counter()
    for report in reports:
        errors.update(report["errors"])
    in_window = sum(report["turns_in_window"] for report in reports)
    return {
        "processes": processes,
        "hold_ms": hold_ms,
        "poll_ms": poll_ms,
        "seconds": CONTENTION_SECONDS,
        "turns_in_window": in_window,
        "turns_per_s": in_window / CONTENTION_SECONDS,
        "turns": sum(report["turns"] for report in reports),
        "abandoned": sum(report["abandoned"] for report in reports),
        "admission_polls": sum(report["admission_polls"] for report in reports),
        # CPU seconds the workers used (user + system); compare with cores x window.
        "worker_cpu_s": sum(report.get("cpu_s", 0.0) for report in reports),
        # SQLite: how long writing units held the writer gate, and their COMMITs (0 on PostgreSQL).
        "gate_units": sum(report["gate_units"] for report in reports),
        "gate_hold_us_per_unit": _per_unit(reports, "gate_held_s", "gate_units"),
        "commit_us_per_unit": _per_unit(reports, "commit_s", "gate_units"),
        "commit_median_us_worker0": reports[0]["commit_median_us"],
        "errors": dict(errors),
        "raw_errors": sum(count for kind, count in errors.items() if kind.startswith(RAW_KINDS)),
        "transaction_faults": errors.get("dispatch:transaction_fault", 0),
        **journal_peaks(path),
    }


@pytest.mark.parametrize(
    ("processes", "hold_ms", "poll_ms"), CONTENTION_CASES, ids=[f"P{p}-hold{h}-poll{q}" for p, h, q in CONTENTION_CASES]
)
def test_contention(benchmark, disk_dir: Path, processes: int, hold_ms: int, poll_ms: int) -> None:
    """P processes share one file: every turn ends, and seats never exceed the policy."""
    _measure(benchmark, "contention", migrated(disk_dir / "contention.sqlite"), processes, hold_ms, poll_ms)


def _measure(benchmark, key: str, target: str | Path, processes: int, hold_ms: int, poll_ms: int) -> None:
    """One contention case on ``target``, timed once, recorded under ``RESULTS[key]`` and checked."""
    figures: dict[str, Any] = {}

    def run() -> None:
        figures.update(run_contention(target, processes, hold_ms, poll_ms))

    started = time.perf_counter()
    benchmark.pedantic(run, rounds=1, iterations=1)
    figures["wall_s"] = time.perf_counter() - started
    benchmark.extra_info.update(figures)
    variant = f"hold{hold_ms}" if poll_ms == 1 else f"hold{hold_ms}-poll{poll_ms}"
    RESULTS.setdefault(key, {}).setdefault(variant, {})[f"P{processes}"] = figures
    _check(target, figures)


def _check(target: str | Path, figures: dict[str, Any]) -> None:
    states = request_states(target)
    assert states.get("completed", 0) == figures["turns"] - figures["abandoned"], states
    assert set(states) <= {"completed", "failed"}, states
    assert figures["final_seats"] == 0
    assert figures["max_seats"] <= CONTENTION_POLICY.max_active_turns
    assert figures["max_active"] <= CONTENTION_POLICY.max_active_turns
    if QUICK:
        assert figures["raw_errors"] == 0, figures["errors"]
        assert figures["transaction_faults"] == 0, figures["errors"]


@pytest.mark.parametrize(
    ("processes", "hold_ms", "poll_ms"),
    PG_CONTENTION_CASES,
    ids=[f"P{p}-hold{h}-poll{q}" for p, h, q in PG_CONTENTION_CASES],
)
def test_contention_postgres(benchmark, postgres_url: str, processes: int, hold_ms: int, poll_ms: int) -> None:
    """The same workers on PostgreSQL: every turn ends, and seats never exceed the policy."""
    _measure(benchmark, "contention_pg", postgres_url, processes, hold_ms, poll_ms)
