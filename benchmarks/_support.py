"""Shared pieces of the benchmark suite: sizes, the turn driver, databases and the results registry.

Two modes: the full run (``make bench``) and a quick mode (``BENCH_QUICK=1``, used by
``tests/end_to_end/test_benchmarks_quick.py``) that runs every benchmark once with tiny sizes and
asserts only correctness. Timings are taken here with :func:`time.perf_counter` in both
modes, so the summary ratios (``bench-results/ratios.json``) do not depend on
pytest-benchmark's own statistics, which a disabled run does not produce.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from admission_plane import AdmissionPlane, AdmittedLease, DispatchRecord, LiveTurnCompletion, Policy
from admission_plane.evidence import ProcessIdentity
from admission_plane.states import EventKind, RequestState

QUICK = os.environ.get("BENCH_QUICK", "").lower() in {"1", "true", "yes"}
#: The repository root: workers run as ``python -m benchmarks.<module>`` from here.
REPO = Path(__file__).resolve().parent.parent

ENCRYPTION_KEY = bytes([1]) * 32
CONTENT_KEY = bytes([2]) * 32
#: The lifecycle and depth policy: the 2.2.0 defaults, with no minimum start interval.
LIFECYCLE_POLICY = Policy(8, 8, 0, 1_800_000, 30_000)
#: Contention policy: fewer seats than the largest process count, so the seat limit binds at P = 8.
CONTENTION_POLICY = Policy(4, 4, 0, 1_800_000, 30_000)

#: The original's figures on this machine kind (issue #6): JavaScript, better-sqlite3.
ORIGINAL_TURNS_PER_S_DISK = 307.0
ORIGINAL_TURNS_PER_S_TMPFS = 816.0

LIFECYCLE_TURNS = 5 if QUICK else 1500
FLOOR_TURNS = 5 if QUICK else 1500
RAW_COMMITS = 20 if QUICK else 3000
DEPTHS = (100, 1_000, 10_000)
DEPTH_ROUNDS = 3 if QUICK else 200
CONTENTION_PROCESSES = (1, 2, 4, 8)
CONTENTION_HOLDS_MS = (0, 50)
#: How long a waiting connector sleeps between two ``admit_request`` polls (ms); 5 ms is the sensitivity run.
CONTENTION_POLL_MS = 1
#: (processes, hold ms, poll ms) cases; the quick mode keeps one without hold and one where the seat limit binds.
CONTENTION_CASES: tuple[tuple[int, int, int], ...] = (
    ((2, 0, 1), (8, 50, 1))
    if QUICK
    else (
        *((p, hold, CONTENTION_POLL_MS) for hold in CONTENTION_HOLDS_MS for p in CONTENTION_PROCESSES),
        (1, 0, 5),
        (8, 0, 5),
    )
)
CONTENTION_SECONDS = 0.5 if QUICK else 5.0
#: PostgreSQL contention cases (processes, hold ms, poll ms): the same worker on a fresh database.
PG_CONTENTION_CASES: tuple[tuple[int, int, int], ...] = (
    ((2, 0, 1),) if QUICK else tuple((p, 0, CONTENTION_POLL_MS) for p in CONTENTION_PROCESSES)
)
#: Idle waiters: this many connectors wait this long for seats that stay held (doorbell vs polling).
WAITERS = 4 if QUICK else 16
WAITERS_SECONDS = 0.3 if QUICK else 3.0
WAITERS_POLICY = Policy(2, 2, 0, 1_800_000, 30_000)
#: Admin URL of the PostgreSQL server the PG benchmarks create their database on.
POSTGRES_URL_VARIABLE = "ADMISSION_PLANE_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: Tables a PG run keeps between cases (the migration ledgers); every other table is truncated.
PG_KEPT_TABLES = frozenset({"schema_migrations", "alembic_version"})
#: Transactions of one full turn: enqueue, admit, starting, dispatch intent, active, completed.
TRANSACTIONS_PER_TURN = 6
OPERATIONS = ("enqueue", "admit", "starting", "dispatch_intent", "active", "completed")

COMPLETED = LiveTurnCompletion("completed")

#: Figures gathered by the benchmarks of one session, read by the summary hook in conftest.
RESULTS: dict[str, dict[str, Any]] = {}


def run_together(
    module: str,
    arguments: list[str],
    count: int,
    timeout_s: float,
    interpreter_options: dict[int, list[str]] | None = None,
    root: Path = REPO,
    on_go: Callable[[], object] | None = None,
) -> list[dict[str, Any]]:
    """Start ``count`` worker processes (``python [options] -m <module> <arguments> --index i``)
    from the repository root, wait until each prints ``ready``, release them together with
    ``go``, and return each one's last output line as JSON. ``interpreter_options`` maps a
    worker index to extra interpreter arguments (e.g. ``-m cProfile -o FILE`` for worker 0);
    ``root``: another checkout to run the workers from (its ``admission_plane`` comes first);
    ``on_go``: called once every worker has been released (to start measuring the window)."""
    options = interpreter_options or {}
    workers = [
        subprocess.Popen(
            [sys.executable, *options.get(index, []), "-m", module, *arguments, "--index", str(index)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        if on_go is not None:
            on_go()
        reports = []
        for worker in workers:
            out, _ = worker.communicate(timeout=timeout_s)
            assert worker.returncode == 0
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def own_seconds(stats: Any, needle: str) -> float:
    """Own (``tottime``) seconds of every profiled function whose name contains ``needle``."""
    return sum(
        tottime for (_file, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items() if needle in name
    )


def print_profile(stats: Any, out: Any, top: int) -> None:
    """The ``top`` functions by cumulative and by own time, then everything written to ``out``."""
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def results_dir() -> Path:
    """Where ``ratios.json`` goes (``BENCH_RESULTS_DIR``, default ``bench-results``)."""
    return Path(os.environ.get("BENCH_RESULTS_DIR", "bench-results"))


def wall_ms() -> int:
    """Milliseconds since the epoch (what a connector passes as ``now``)."""
    return time.time_ns() // 1_000_000


def open_plane(path: str | os.PathLike[str], policy: Policy = LIFECYCLE_POLICY) -> AdmissionPlane:
    """A plane with both keys on an already migrated SQLite file."""
    return AdmissionPlane(
        os.fspath(path), policy=policy, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY
    )


def migrated(path: Path) -> Path:
    """Create the schema (Alembic head) in a fresh SQLite file at ``path``."""
    from admission_plane.migrate import upgrade

    upgrade(str(path))
    return path


def empty_postgres(url: str) -> None:
    """Empty every admission table of the PostgreSQL database at ``url`` (all but the migration ledgers)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            names = (
                connection.execute(
                    text(
                        "SELECT table_name FROM information_schema.tables"
                        " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
                    )
                )
                .scalars()
                .all()
            )
            tables = ", ".join(f'"{name}"' for name in sorted(set(names) - PG_KEPT_TABLES))
            if tables:
                connection.execute(text(f"TRUNCATE TABLE {tables} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


def summary(samples: Iterable[float]) -> dict[str, float]:
    """Median, mean, min and count of durations in seconds."""
    values = list(samples)
    return {
        "median_s": statistics.median(values),
        "mean_s": statistics.fmean(values),
        "min_s": min(values),
        "count": len(values),
    }


def request_fields(
    request_id: str, now: int, *, agent_id: str = "agent-0", session_id: str = "session-1"
) -> dict[str, Any]:
    """``enqueue_with_payload``'s arguments for a benchmark turn: one key (``antigravity`` / ``model-bench``) and a
    payload that outlives the queue timeout."""
    return {
        "request_id": request_id,
        "session_id": session_id,
        "agent_id": agent_id,
        "fingerprint": "fp-1",
        "provider": "antigravity",
        "model": "model-bench",
        "now": now,
        "plaintext": f"prompt {request_id}",
        "expires_at": now + 1_800_001,
    }


def dispatch_record(plane: AdmissionPlane, lease: AdmittedLease, child: ProcessIdentity) -> DispatchRecord:
    """The dispatch intent of ``lease``'s turn, by ``plane``'s connector, for ``child``, prompt on stdin."""
    return DispatchRecord.for_lease(lease, plane.owner_identity, child, prompt_channel="stdin")


class TurnDriver:
    """Drives full turns through one plane and times each operation.

    One turn: enqueue with payload -> admit_next -> starting -> dispatch intent with
    process identity -> active -> completed: six write transactions.
    """

    def __init__(self, plane: AdmissionPlane, child: ProcessIdentity, prefix: str) -> None:
        self.plane = plane
        self.child = child
        self.prefix = prefix
        self.owner = plane.owner_identity.owner_instance_id
        self.count = 0
        self.now = wall_ms()
        self.turn_times: list[float] = []
        self.op_times: dict[str, list[float]] = {name: [] for name in OPERATIONS}

    def turn(self) -> AdmittedLease:
        """Run one full turn; return its lease (every step is checked)."""
        plane, clock = self.plane, time.perf_counter
        self.count += 1
        self.now += 10
        now, request_id = self.now, f"{self.prefix}-{self.count}"
        ops = self.op_times
        t0 = clock()
        plane.enqueue_with_payload(**request_fields(request_id, now))
        t1 = clock()
        lease = plane.admit_next(now + 1, self.owner)
        t2 = clock()
        assert lease is not None
        assert lease.request_id == request_id, lease
        plane.mark_starting(lease, now + 2)
        t3 = clock()
        result = plane.commit_dispatch_intent(dispatch_record(plane, lease, self.child))
        t4 = clock()
        assert result.ok, result
        plane.mark_active(lease, now + 4)
        t5 = clock()
        plane.complete_live_turn(lease, now + 5, COMPLETED)
        t6 = clock()
        for name, start, end in zip(OPERATIONS, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6), strict=True):
            ops[name].append(end - start)
        self.turn_times.append(t6 - t0)
        return lease

    def figures(self) -> dict[str, Any]:
        """Turns/s (from the median turn and from the total) and per-operation medians in µs."""
        turns = summary(self.turn_times)
        return {
            "turns": turns["count"],
            "turns_per_s_median": 1.0 / turns["median_s"],
            "turns_per_s_total": turns["count"] / sum(self.turn_times),
            "turn_median_us": turns["median_s"] * 1e6,
            "op_median_us": {name: statistics.median(times) * 1e6 for name, times in self.op_times.items()},
            "op_mean_us": {name: statistics.fmean(times) * 1e6 for name, times in self.op_times.items()},
        }


def _rows(target: str | os.PathLike[str], sql: str) -> list[tuple[Any, ...]]:
    """Rows of one read-only query on an SQLite file path or a database URL (PostgreSQL)."""
    text_target = os.fspath(target)
    if "://" in text_target:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(text_target, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(sql))]
        finally:
            engine.dispose()
    with sqlite3.connect(text_target) as connection:
        rows = connection.execute(sql).fetchall()
    connection.close()
    return rows


def request_states(target: str | os.PathLike[str]) -> dict[str, int]:
    """How many requests are in each state (SQLite file path or database URL)."""
    rows = _rows(target, "SELECT state, count(*) FROM turn_requests GROUP BY state")
    return {state: count for state, count in rows}


_SEAT_TAKEN = {EventKind.REQUEST_ADMITTED}
_SEAT_FREED = {EventKind.REQUEST_RELEASED, EventKind.REQUEST_ABANDONED, EventKind.REQUEST_RECOVERY_SEAT_RELEASED}


def journal_peaks(target: str | os.PathLike[str]) -> dict[str, int]:
    """Replay the journal: the most seat-holding leases at once (exact) and at most how many were ``active``.

    SQLite serialises every writer, so ``event_seq`` is commit order and both figures are
    exact. On PostgreSQL, lease units (starting ... completion) commit side by side and may
    commit in another order than their ``event_seq`` (see
    ``admission_plane.store.unit_of_work``); the replay stays in ``event_seq`` order, which
    is provably right for seats: a seat is taken only by ``request_admitted``, written by an
    admission unit that runs alone, so it sits exactly where it committed, and every event
    between two admissions only frees seats, so the count after each admission is exact and
    nothing between two admissions can exceed it. ``active`` is raised by lease units, so its
    peak is bounded from above instead: within each run of events between two admissions,
    every activation is counted before any departure. That bound never exceeds the seats
    held after the admission that opens the run, so ``max_active <= seats`` stays a sound check.
    """
    rows = _rows(target, "SELECT kind, from_state, to_state FROM events ORDER BY event_seq")
    seats = active = max_seats = max_active = 0
    rises = falls = 0  # activations and departures from ``active`` since the last admission
    for kind, from_state, to_state in rows:
        if kind in _SEAT_TAKEN:
            active += rises - falls
            rises = falls = 0
            seats += 1
        elif kind in _SEAT_FREED:
            seats -= 1
        rises += to_state == RequestState.ACTIVE
        falls += from_state == RequestState.ACTIVE
        max_seats, max_active = max(max_seats, seats), max(max_active, active + rises)
    return {"max_seats": max_seats, "max_active": max_active, "final_seats": seats}
