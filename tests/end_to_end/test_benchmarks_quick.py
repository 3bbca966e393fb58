"""The benchmark suite's quick mode, run as an ordinary test: each benchmark once, correctness only.

``benchmarks/`` runs in a child pytest with ``BENCH_QUICK=1`` (tiny sizes, a short
contention window with one case where the seat limit binds) and pytest-benchmark
disabled. Nothing here looks at a timing: the assertions are that every benchmark
passed its own checks (every turn completed, the floor issues the service's exact
statements) and, from the session summary, that no raw SQLite error or
``transaction_fault`` dispatch intent reached a connector and no more seats were ever
held than the policy allows. The PostgreSQL contention path runs too (on a fresh
database of the server named by ``ADMISSION_PLANE_TEST_POSTGRES_URL``); without a
reachable server that test skips, and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gates import require

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the whole benchmark suite once in quick mode; its process result and ``ratios.json``."""
    results = tmp_path_factory.mktemp("bench-results")
    env = {
        **os.environ,
        "BENCH_QUICK": "1",
        "BENCH_RESULTS_DIR": str(results),
        "BENCH_DISK_DIR": str(tmp_path_factory.mktemp("bench-db")),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "benchmarks",
        "--benchmark-disable",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--timeout=240",
    ]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    report_path = results / "ratios.json"
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else {}
    return completed, report


def test_every_benchmark_passes_its_correctness_checks_in_quick_mode(quick_run) -> None:
    """Each benchmark runs once and passes: all turns complete, the floor's statements equal the service's."""
    completed, _ = quick_run
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    # Only the final outcome line counts (a skip reason such as "port 5432 failed" is not a failure).
    outcome = completed.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", outcome), outcome
    assert not re.search(r"\d+ (failed|errors?)\b", outcome), outcome


def test_quick_contention_has_no_raw_errors_and_respects_the_seat_limit(quick_run) -> None:
    """Under contention no raw SQLite error or transaction fault reaches a connector, and seats stay within policy."""
    _, report = quick_run
    targets = report["targets"]
    assert targets["contention_raw_sqlite_errors"]["value"] == 0
    assert targets["contention_transaction_faults"]["value"] == 0
    assert targets["contention_max_seats_vs_policy"]["met"] is True
    runs = [run for variant in report["figures"]["contention"].values() for run in variant.values()]
    assert runs
    assert all(run["max_seats"] <= 4 and run["final_seats"] == 0 for run in runs)


def test_quick_mode_measures_every_figure_the_summary_needs(quick_run) -> None:
    """Lifecycle, floor, raw commits and every depth are measured, so the full run's ratios can be computed."""
    _, report = quick_run
    figures = report["figures"]
    assert figures["lifecycle"]["disk"]["turns"] == 5
    assert figures["floor"]["disk"]["turns"] == 5
    assert figures["raw_commit"]["disk"]["commits"] == 20
    assert set(figures["depth"]["admit_next"]) == {"100", "1000", "10000"}
    assert set(figures["depth"]["admit_request"]) == {"100", "1000", "10000"}


def test_quick_async_turns_complete_without_a_thread_per_waiting_turn(quick_run) -> None:
    """The asyncio and the thread-per-turn runs complete every turn; the asyncio one uses far fewer threads."""
    _, report = quick_run
    runs = report["figures"]["async"]
    assert runs["asyncio"]["turns"] == runs["threads"]["turns"] > 0
    assert runs["asyncio"]["peak_threads"] < runs["threads"]["peak_threads"]


def test_quick_postgres_contention_has_no_raw_errors_and_respects_the_seat_limit(quick_run) -> None:
    """The same workers on PostgreSQL: no raw driver error or transaction fault, seats within policy, all turns end."""
    _, report = quick_run
    figures = report["figures"]
    unavailable = figures.get("postgres", {}).get("unavailable")
    require(unavailable is None and "contention_pg" in figures, unavailable or "the PostgreSQL benchmarks did not run")
    targets = report["targets"]
    assert targets["contention_pg_raw_driver_errors"]["value"] == 0
    assert targets["contention_pg_transaction_faults"]["value"] == 0
    assert targets["contention_pg_max_seats_vs_policy"]["met"] is True
    runs = [run for variant in figures["contention_pg"].values() for run in variant.values()]
    assert runs
    assert all(run["turns"] > 0 and run["max_seats"] <= 4 and run["final_seats"] == 0 for run in runs)


def test_quick_adversarial_depth_runs_every_shape_on_both_dialects(quick_run) -> None:
    """Every adversarial queue shape ran both operations (its checks: each admission chose the shape's next
    request, each look said what to wait for), on SQLite and, with a server, on PostgreSQL."""
    _, report = quick_run
    figures = report["figures"]
    shapes = figures["depth_adversarial"]["sqlite"]
    assert len(shapes) >= 12
    assert all(set(operations) == {"admit_next", "waiting_look"} for operations in shapes.values())
    unavailable = figures.get("postgres", {}).get("unavailable")
    require(unavailable is None, unavailable or "")
    assert set(figures["depth_adversarial"]["postgresql"]) == set(shapes)
