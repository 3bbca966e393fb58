"""PostgreSQL scale (issue 16): the plane's lifecycle beside the raw commit rate, in one run.

``python -m benchmarks.pg_scale`` creates two fresh databases on the server named by
``ADMISSION_PLANE_TEST_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``):
one migrated for the plane, one holding only the ``raw_commits`` table. For each P it runs,
interleaved round by round (raw then plane, then plane then raw, ...) so that both see the
same neighbours on a shared machine:

* the raw commit rate: P processes (``benchmarks._raw_commit_worker``), each committing one
  one-row insert per transaction, ``synchronous_commit = on``;
* the plane: P connector processes (``benchmarks._contention_worker``), each driving its own
  turns through the whole lifecycle (enqueue, admission, starting, dispatch intent, active,
  completed: six durable transactions), policy 8 seats / 8 starts / 0 ms interval (the seat
  limit binds at P = 16).

The ratio of P is the plane's median turns/s over the raw median commits/s ÷ 6 (the turns/s
the server could commit if each turn were six minimal transactions). Then the same at
P = 8 split over ``--hosts`` simulated hosts (distinct ``host_id`` per process, one
database). After every plane case the journal is replayed (``benchmarks._support.journal_peaks``)
and checked: at most 8 seats, every request completed, no seat left, no raw driver error,
no ``transaction_fault``. With ``--sqlite-runs N`` it also runs the SQLite contention pair
(P = 1 and P = 8, policy 4 seats, one file on the real disk) N times and reports the median
P8/P1. Everything is printed and merged into ``ratios.json`` (``--ratios``; existing keys
other than the ones written here are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from admission_plane import Policy

from ._contention_worker import RAW_KINDS
from ._support import (
    CONTENTION_POLICY,
    DEFAULT_POSTGRES_ADMIN_URL,
    PG_KEPT_TABLES,
    POSTGRES_URL_VARIABLE,
    REPO,
    TRANSACTIONS_PER_TURN,
    journal_peaks,
    migrated,
    request_states,
    run_together,
)

SCALE_POLICY = Policy(8, 8, 0, 1_800_000, 30_000)
START_TIMEOUT_S = 180


def _plane_case(url: str, processes: int, seconds: float, policy: Policy, hosts: int = 0) -> dict[str, Any]:
    arguments = ["--database", url, "--seconds", str(seconds), "--policy", json.dumps(list(policy.as_tuple()))]
    if hosts:
        arguments += ["--hosts", str(hosts)]
    reports = run_together("benchmarks._contention_worker", arguments, processes, seconds + START_TIMEOUT_S)
    errors: dict[str, int] = {}
    for report in reports:
        for kind, count in report["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    turns = sum(report["turns"] for report in reports)
    abandoned = sum(report["abandoned"] for report in reports)
    peaks = journal_peaks(url)
    states = request_states(url)
    figures = {
        "processes": processes,
        "hosts": hosts or 1,
        "turns_per_s": sum(report["turns_in_window"] for report in reports) / seconds,
        "turns": turns,
        "worker_cpu_s": sum(report["cpu_s"] for report in reports),
        "admission_polls": sum(report["admission_polls"] for report in reports),
        "errors": errors,
        "raw_errors": sum(count for kind, count in errors.items() if kind.startswith(RAW_KINDS)),
        "transaction_faults": errors.get("dispatch:transaction_fault", 0),
        **peaks,
    }
    figures["limits_held"] = bool(
        peaks["max_seats"] <= policy.max_active_turns
        and peaks["max_active"] <= policy.max_active_turns
        and peaks["final_seats"] == 0
        and states.get("completed", 0) == turns - abandoned
        and set(states) <= {"completed", "failed"}
    )
    return figures


def _raw_case(url: str, processes: int, seconds: float) -> dict[str, Any]:
    reports = run_together(
        "benchmarks._raw_commit_worker",
        ["--database", url, "--seconds", str(seconds)],
        processes,
        seconds + START_TIMEOUT_S,
    )
    return {"processes": processes, "commits_per_s": sum(report["commits"] for report in reports) / seconds}


def _truncate(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            names = connection.execute(
                text(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
                )
            ).scalars()
            tables = ", ".join(f'"{name}"' for name in sorted(set(names) - PG_KEPT_TABLES))
            if tables:
                connection.execute(text(f"TRUNCATE TABLE {tables} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def run_postgres(
    processes: list[int], seconds: float, rounds: int, hosts: int, admin: str | None = None
) -> dict[str, Any]:
    """The interleaved PostgreSQL series (see the module docstring)."""
    from admission_plane.migrate import upgrade

    admin_url = make_url(admin or os.environ.get(POSTGRES_URL_VARIABLE) or DEFAULT_POSTGRES_ADMIN_URL)
    if admin_url.drivername == "postgresql":
        admin_url = admin_url.set(drivername="postgresql+psycopg")
    suffix = uuid.uuid4().hex[:10]
    plane_db, raw_db = f"ap_scale_{suffix}", f"ap_scale_raw_{suffix}"
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{plane_db}"'))
        connection.execute(text(f'CREATE DATABASE "{raw_db}"'))
        server = {
            name: connection.execute(text(f"SHOW {name}")).scalar_one()
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
    plane_url = admin_url.set(database=plane_db).render_as_string(hide_password=False)
    raw_sqlalchemy = admin_url.set(database=raw_db)
    raw_url = raw_sqlalchemy.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        upgrade(plane_url)
        raw_engine = create_engine(raw_sqlalchemy, poolclass=NullPool)
        with raw_engine.begin() as connection:
            connection.execute(text("CREATE TABLE raw_commits (id bigserial PRIMARY KEY, worker int, n int)"))
        raw_engine.dispose()
        series: dict[str, Any] = {}
        cases = [(p, 0) for p in processes] + ([(8, hosts)] if hosts else [])
        for p, host_count in cases:
            raws: list[dict[str, Any]] = []
            planes: list[dict[str, Any]] = []
            for round_index in range(rounds):
                order = ("raw", "plane") if round_index % 2 == 0 else ("plane", "raw")
                for kind in order:
                    if kind == "raw":
                        raws.append(_raw_case(raw_url, p, seconds))
                    else:
                        _truncate(plane_url)
                        planes.append(_plane_case(plane_url, p, seconds, SCALE_POLICY, host_count))
            raw_rate = _median([r["commits_per_s"] for r in raws])
            plane_rate = _median([r["turns_per_s"] for r in planes])
            floor = raw_rate / TRANSACTIONS_PER_TURN
            key = f"P{p}" if not host_count else f"P{p}-hosts{host_count}"
            series[key] = {
                "processes": p,
                "hosts": host_count or 1,
                "raw_commits_per_s": raw_rate,
                "floor_turns_per_s": floor,
                "plane_turns_per_s": plane_rate,
                "ratio_to_floor": plane_rate / floor if floor else None,
                "raw_runs": [r["commits_per_s"] for r in raws],
                "plane_runs": [r["turns_per_s"] for r in planes],
                "raw_driver_errors": sum(r["raw_errors"] for r in planes),
                "transaction_faults": sum(r["transaction_faults"] for r in planes),
                "max_seats": max(r["max_seats"] for r in planes),
                "max_active_bound": max(r["max_active"] for r in planes),
                "limits_held": all(r["limits_held"] for r in planes),
                "worker_cpu_s": [r["worker_cpu_s"] for r in planes],
                "errors": [r["errors"] for r in planes],
            }
            print(json.dumps({key: {k: v for k, v in series[key].items() if k != "errors"}}), flush=True)
        return {"server": server, "policy": list(SCALE_POLICY.as_tuple()), "seconds": seconds, "series": series}
    finally:
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{plane_db}" WITH (FORCE)'))
            connection.execute(text(f'DROP DATABASE IF EXISTS "{raw_db}" WITH (FORCE)'))
        engine.dispose()


def run_sqlite(runs: int, seconds: float) -> dict[str, Any]:
    """SQLite contention P = 1 then P = 8 on a fresh file each, ``runs`` times; the median P8/P1."""
    ratios, pairs = [], []
    for _ in range(runs):
        rates = {}
        for p in (1, 8):
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DISK_DIR")) as folder:
                path = migrated(Path(folder) / "contention.sqlite")
                figures = _plane_case(str(path), p, seconds, CONTENTION_POLICY)
                assert figures["limits_held"], figures
                assert figures["raw_errors"] == 0, figures
                rates[p] = figures["turns_per_s"]
        pairs.append(rates)
        ratios.append(rates[8] / rates[1])
        print(json.dumps({"sqlite_pair": rates, "ratio": rates[8] / rates[1]}), flush=True)
    return {"runs": pairs, "ratios": ratios, "median_P8_vs_P1": statistics.median(ratios), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    """Run the series and merge the figures into ``ratios.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=4, help="simulated hosts for the P = 8 hosts case (0: none)")
    parser.add_argument("--sqlite-runs", type=int, default=0)
    parser.add_argument("--sqlite-seconds", type=float, default=5.0)
    parser.add_argument("--ratios", default=str(REPO / "ratios.json"))
    args = parser.parse_args(argv)
    started = time.time()
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
    report["load_average_at_start"] = os.getloadavg()
    processes = [int(p) for p in args.processes.split(",") if p]
    if processes:
        report["postgres"] = run_postgres(processes, args.seconds, args.rounds, args.hosts)
    if args.sqlite_runs:
        report["sqlite_contention"] = run_sqlite(args.sqlite_runs, args.sqlite_seconds)
    report["load_average_at_end"] = os.getloadavg()
    path = Path(args.ratios)
    existing = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    scale = existing.get("issue16_postgres_scale", {})
    if "postgres" in report:
        series = report["postgres"]["series"]
        scale = {
            "measured": report["started"],
            "method": "interleaved raw/plane rounds in one run; ratio = plane turns/s / (raw commits/s / 6)",
            "server": report["postgres"]["server"],
            "ratios": {key: entry["ratio_to_floor"] for key, entry in series.items()},
            "targets": {"P1": ">= 0.50", "P8": ">= 0.40"},
            "series": series,
            "load_average": [report["load_average_at_start"], report["load_average_at_end"]],
        }
    existing["issue16_postgres_scale"] = scale
    if "sqlite_contention" in report:
        existing["issue16_sqlite_contention"] = {"target_median_P8_vs_P1": ">= 0.80", **report["sqlite_contention"]}
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
