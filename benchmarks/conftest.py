"""Fixtures of the benchmark suite, and the summary of ratios measured in one session.

Database files live on the real disk (pytest's ``tmp_path``, which is on the root ext4
file system here; ``BENCH_DISK_DIR`` overrides it) or on ``/dev/shm`` (tmpfs) for the
tmpfs variants. The PostgreSQL contention benchmarks share one fresh database per session
(``ap_bench_<hex>``, created on the server named by ``ADMISSION_PLANE_TEST_POSTGRES_URL``,
default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``, migrated to head, dropped
at the end; the admission tables are truncated before each case) and skip with a one-line
reason when no server is reachable. At the end of the session the figures gathered in
:data:`benchmarks._support.RESULTS` are turned into the target ratios, printed, and
written to ``bench-results/ratios.json`` (``BENCH_RESULTS_DIR`` overrides the folder).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from admission_plane.evidence import ProcessIdentity, capture

from ._support import (
    CONTENTION_POLICY,
    DEFAULT_POSTGRES_ADMIN_URL,
    ORIGINAL_TURNS_PER_S_DISK,
    ORIGINAL_TURNS_PER_S_TMPFS,
    POSTGRES_URL_VARIABLE,
    QUICK,
    RESULTS,
    TRANSACTIONS_PER_TURN,
    empty_postgres,
    results_dir,
)

TMPFS = Path("/dev/shm")


def _filesystem(path: Path) -> str:
    try:
        out = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True, check=False, timeout=10
        )
        lines = out.stdout.split()
        return lines[0] if lines else "unknown"
    except OSError:
        return "unknown"


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    """A folder on the real disk (never tmpfs) for database files."""
    base = os.environ.get("BENCH_DISK_DIR")
    folder = Path(tempfile.mkdtemp(dir=base)) if base else tmp_path
    assert _filesystem(folder) != "tmpfs", f"{folder} is on tmpfs; set BENCH_DISK_DIR to a real disk"
    return folder


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A fresh folder on ``/dev/shm``; skips where there is no tmpfs."""
    if not TMPFS.is_dir() or _filesystem(TMPFS) != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    folder = Path(tempfile.mkdtemp(prefix="admission-bench-", dir=TMPFS))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["disk", "tmpfs"])
def storage(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(name, folder) for each storage kind: the real disk and tmpfs."""
    name = request.param
    folder = request.getfixturevalue("disk_dir" if name == "disk" else "tmpfs_dir")
    return name, folder


@pytest.fixture(scope="session")
def child_identity() -> ProcessIdentity:
    """Process identity of a live process (this one) standing in for a dispatch child."""
    return capture(os.getpid())


class _PostgresDatabase:
    """A fresh, migrated PostgreSQL database for this session, or why there is none."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.unavailable: str | None = None


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[_PostgresDatabase]:
    """Create ``ap_bench_<hex>`` on the admin URL's server, migrate it to head, drop it at the end."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    from admission_plane.migrate import upgrade

    database = _PostgresDatabase()
    admin_url = make_url(os.environ.get(POSTGRES_URL_VARIABLE) or DEFAULT_POSTGRES_ADMIN_URL)
    if admin_url.drivername == "postgresql":
        admin_url = admin_url.set(drivername="postgresql+psycopg")
    shown = admin_url.render_as_string(hide_password=True)
    name = f"ap_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(
        admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool, connect_args={"connect_timeout": 5}
    )
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except (SQLAlchemyError, ImportError, OSError) as error:  # no server, no driver, no right: skip
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        database.unavailable = f"PostgreSQL at {shown} is unavailable: {first_line}"
        RESULTS.setdefault("postgres", {})["unavailable"] = database.unavailable
        admin.dispose()
        yield database
        return
    try:
        database.url = admin_url.set(database=name).render_as_string(hide_password=False)
        upgrade(database.url)
        with admin.connect() as connection:
            settings = {
                setting: connection.execute(text(f"SHOW {setting}")).scalar_one()
                for setting in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
            }
        RESULTS.setdefault("postgres", {})["server"] = settings
        yield database
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_database: _PostgresDatabase) -> str:
    """URL of the session's PostgreSQL database with every admission table emptied; skips without a server."""
    if postgres_database.url is None:
        pytest.skip(postgres_database.unavailable or "PostgreSQL is unavailable")
    url = postgres_database.url
    empty_postgres(url)
    return url


# --- the summary ---------------------------------------------------------------------------------


def _get(path: str) -> Any:
    node: Any = RESULTS
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if not isinstance(numerator, int | float) or not isinstance(denominator, int | float) or denominator == 0:
        return None
    return numerator / denominator


def _contention_totals(key: str) -> tuple[int | None, int | None, int | None]:
    """Raw driver errors, ``transaction_fault`` intents and the seat peak over every run under ``RESULTS[key]``."""
    runs = [run for variant in RESULTS.get(key, {}).values() for run in variant.values()]
    if not runs:
        return None, None, None
    return (
        sum(run["raw_errors"] for run in runs),
        sum(run["transaction_faults"] for run in runs),
        max(run["max_seats"] for run in runs),
    )


def adversarial_ratios() -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """Per dialect, shape and operation: the fastest round at each depth over the fastest at D = 100."""
    table: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    for dialect, shapes in RESULTS.get("depth_adversarial", {}).items():
        for shape, operations in shapes.items():
            for operation, depths in operations.items():
                base = depths.get("100", {}).get("min_us")
                table.setdefault(dialect, {}).setdefault(shape, {})[operation] = {
                    f"{depth}_vs_100": _ratio(figures["min_us"], base)
                    for depth, figures in depths.items()
                    if depth != "100"
                }
    return table


def _adversarial_worst(dialect: str, depth: int) -> float | None:
    """The largest D/100 ratio over the issue's shapes (not the probes) and both operations."""
    probes = set(RESULTS.get("depth_adversarial_probes", []))
    values = [
        ratio
        for shape, operations in adversarial_ratios().get(dialect, {}).items()
        if shape not in probes
        for ratios in operations.values()
        for key, ratio in ratios.items()
        if key == f"{depth}_vs_100" and ratio is not None
    ]
    return max(values) if values else None


def compute_ratios() -> dict[str, Any]:
    """The issue's targets, each as a ratio of figures measured in this session."""
    ours_disk = _get("lifecycle.disk.turns_per_s_median")
    floor_disk = _get("floor.disk.turns_per_s_median")
    commits = _get("raw_commit.disk.commits_per_s")
    p1, p8 = _get("contention.hold0.P1.turns_per_s"), _get("contention.hold0.P8.turns_per_s")
    raw_errors, faults, peak = _contention_totals("contention")
    pg_p1, pg_p8 = _get("contention_pg.hold0.P1.turns_per_s"), _get("contention_pg.hold0.P8.turns_per_s")
    pg_raw_errors, pg_faults, pg_peak = _contention_totals("contention_pg")
    seats = CONTENTION_POLICY.max_active_turns
    targets = {
        "lifecycle_disk_vs_floor": {"value": _get("paired.disk.ratio_median"), "target": ">= 0.60"},
        "lifecycle_disk_vs_original": {"value": _ratio(ours_disk, ORIGINAL_TURNS_PER_S_DISK), "target": "> 1.00"},
        # The fastest round estimates an operation's own cost on a machine shared with other
        # work; a median of a few hundred ~1 ms rounds still moves by 2x with the neighbours.
        "depth_admit_next_10000_vs_100": {
            "value": _ratio(_get("depth.admit_next.10000.min_us"), _get("depth.admit_next.100.min_us")),
            "target": "<= 2.00",
        },
        # Issue #13: for every adversarial queue shape, both operations (the worst of them).
        "depth_adversarial_10000_vs_100_worst": {"value": _adversarial_worst("sqlite", 10_000), "target": "<= 2.00"},
        "depth_adversarial_pg_10000_vs_100_worst": {
            "value": _adversarial_worst("postgresql", 10_000),
            "target": "<= 2.00",
        },
        "contention_P8_vs_P1": {"value": _ratio(p8, p1), "target": ">= 0.80"},
        "contention_raw_sqlite_errors": {"value": raw_errors, "target": "== 0"},
        "contention_transaction_faults": {"value": faults, "target": "== 0"},
        "contention_max_seats_vs_policy": {"value": peak, "target": f"<= {seats}"},
        "contention_pg_P8_vs_P1": {"value": _ratio(pg_p8, pg_p1), "target": ">= 0.80"},
        "contention_pg_raw_driver_errors": {"value": pg_raw_errors, "target": "== 0"},
        "contention_pg_transaction_faults": {"value": pg_faults, "target": "== 0"},
        "contention_pg_max_seats_vs_policy": {"value": pg_peak, "target": f"<= {seats}"},
    }
    checks = {
        "lifecycle_disk_vs_floor": lambda x: x >= 0.60,
        "lifecycle_disk_vs_original": lambda x: x > 1.0,
        "depth_admit_next_10000_vs_100": lambda x: x <= 2.0,
        "depth_adversarial_10000_vs_100_worst": lambda x: x <= 2.0,
        "depth_adversarial_pg_10000_vs_100_worst": lambda x: x <= 2.0,
        "contention_P8_vs_P1": lambda x: x >= 0.80,
        "contention_raw_sqlite_errors": lambda x: x == 0,
        "contention_transaction_faults": lambda x: x == 0,
        "contention_max_seats_vs_policy": lambda x: x <= seats,
        "contention_pg_P8_vs_P1": lambda x: x >= 0.80,
        "contention_pg_raw_driver_errors": lambda x: x == 0,
        "contention_pg_transaction_faults": lambda x: x == 0,
        "contention_pg_max_seats_vs_policy": lambda x: x <= seats,
    }
    for name, entry in targets.items():
        entry["met"] = None if entry["value"] is None else bool(checks[name](entry["value"]))
    info = {
        "lifecycle_disk_vs_floor_separate_runs": _ratio(ours_disk, floor_disk),
        "lifecycle_tmpfs_vs_floor_paired": _get("paired.tmpfs.ratio_median"),
        "lifecycle_tmpfs_vs_original": _ratio(_get("lifecycle.tmpfs.turns_per_s_median"), ORIGINAL_TURNS_PER_S_TMPFS),
        "lifecycle_tmpfs_vs_floor_tmpfs": _ratio(
            _get("lifecycle.tmpfs.turns_per_s_median"), _get("floor.tmpfs.turns_per_s_median")
        ),
        "disk_ceiling_turns_per_s": None if commits is None else commits / TRANSACTIONS_PER_TURN,
        "lifecycle_disk_vs_ceiling": _ratio(ours_disk, None if commits is None else commits / TRANSACTIONS_PER_TURN),
        "floor_disk_vs_ceiling": _ratio(floor_disk, None if commits is None else commits / TRANSACTIONS_PER_TURN),
        "depth_admit_next_10000_vs_100_median": _ratio(
            _get("depth.admit_next.10000.median_us"), _get("depth.admit_next.100.median_us")
        ),
        "depth_admit_request_10000_vs_100": _ratio(
            _get("depth.admit_request.10000.min_us"), _get("depth.admit_request.100.min_us")
        ),
        "depth_waiting_look_10000_vs_100": _ratio(
            _get("depth.waiting_look.10000.min_us"), _get("depth.waiting_look.100.min_us")
        ),
        "depth_admit_request_10000_vs_100_median": _ratio(
            _get("depth.admit_request.10000.median_us"), _get("depth.admit_request.100.median_us")
        ),
        "depth_adversarial_100000_vs_100_worst": _adversarial_worst("sqlite", 100_000),
        "depth_adversarial_pg_100000_vs_100_worst": _adversarial_worst("postgresql", 100_000),
        "contention_poll5ms_P8_vs_P1": _ratio(
            _get("contention.hold0-poll5.P8.turns_per_s"), _get("contention.hold0-poll5.P1.turns_per_s")
        ),
        "contention_hold50_P8_vs_P1": _ratio(
            _get("contention.hold50.P8.turns_per_s"), _get("contention.hold50.P1.turns_per_s")
        ),
        "waiters_cpu_doorbell_vs_polling": _ratio(
            _get("waiters.doorbell.cpu_s_per_s"), _get("waiters.polling.cpu_s_per_s")
        ),
        "waiters_looks_doorbell_vs_polling": _ratio(
            _get("waiters.doorbell.looks_per_waiter_per_s"), _get("waiters.polling.looks_per_waiter_per_s")
        ),
        "waiters_pg_cpu_doorbell_vs_polling": _ratio(
            _get("waiters_postgresql.doorbell.cpu_s_per_s"), _get("waiters_postgresql.polling.cpu_s_per_s")
        ),
        "async_threads_vs_sync_threads": _ratio(_get("async.asyncio.peak_threads"), _get("async.threads.peak_threads")),
        "async_cpu_per_turn_vs_sync": _ratio(
            _get("async.asyncio.cpu_s_per_turn"), _get("async.threads.cpu_s_per_turn")
        ),
        "async_admissions_per_s_vs_sync": _ratio(
            _get("async.asyncio.admissions_per_s"), _get("async.threads.admissions_per_s")
        ),
        "async_loop_lag_p99_ms": _get("async.asyncio.loop_lag_p99_ms"),
        "contention_pg_P1_vs_sqlite_P1": _ratio(pg_p1, p1),
        "contention_pg_P8_vs_sqlite_P8": _ratio(pg_p8, p8),
    }
    return {"targets": targets, "informational": info, "depth_adversarial": adversarial_ratios()}


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "quick": QUICK,
    }


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the target ratios of this session and write ``ratios.json`` beside the benchmark JSON."""
    if not RESULTS:
        return
    report = {"machine": _machine(), **compute_ratios(), "figures": RESULTS}
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ratios.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write = terminalreporter.write_line
    terminalreporter.section("admission-plane benchmark ratios (one session)")
    for name, entry in report["targets"].items():
        value = entry["value"]
        shown = "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
        verdict = {True: "met", False: "MISSED", None: "not measured"}[entry["met"]]
        write(f"{name:<36} {shown:>10}  target {entry['target']:<8} {verdict}")
    for name, value in report["informational"].items():
        write(f"{name:<36} {'n/a' if value is None else f'{value:.3f}':>10}")
    probes = set(RESULTS.get("depth_adversarial_probes", []))
    for dialect, shapes in report["depth_adversarial"].items():
        for shape, operations in sorted(shapes.items()):
            shown = "  ".join(
                f"{operation} "
                + " ".join(
                    f"{key}={'n/a' if ratio is None else f'{ratio:.2f}'}"
                    for key, ratio in sorted(ratios.items(), key=lambda item: int(item[0].split("_")[0]))
                )
                for operation, ratios in sorted(operations.items())
            )
            write(f"adversarial {dialect:<10} {shape:<26}{' (probe)' if shape in probes else ''} {shown}")
    unavailable = _get("postgres.unavailable")
    if unavailable:
        write(f"PostgreSQL benchmarks skipped: {unavailable}")
    write(f"written to {folder / 'ratios.json'}")
