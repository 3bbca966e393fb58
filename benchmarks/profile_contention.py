"""Profile one contention worker: ``python -m benchmarks.profile_contention [--processes 8] [--database URL]``.

Starts P workers of :mod:`benchmarks._contention_worker` on one fresh SQLite file on the
real disk (or on ``--database``, e.g. an already migrated PostgreSQL URL), worker 0 under
``python -m cProfile``, releases them together, and prints every worker's figures
(turns, polls, CPU seconds) and worker 0's profile: where its wall time went (sleeping
between admission polls, sleeping for SQLite's write lock, the database's own statements
and commits, Python) and the functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import tempfile
from pathlib import Path

from ._support import CONTENTION_POLICY, migrated, own_seconds, print_profile, run_together

REPO = Path(__file__).resolve().parent.parent


def _sleep_by_caller(stats: pstats.Stats) -> dict[str, float]:
    """Seconds spent in ``time.sleep``, by the function that called it."""
    for (_file, _line, name), (_cc, _nc, _tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name == "<built-in method time.sleep>":
            return {caller[2]: values[2] for caller, values in callers.items()}
    return {}


def main(argv: list[str] | None = None) -> None:
    """Run, profile worker 0, print."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--hold-ms", type=float, default=0)
    parser.add_argument("--poll-ms", type=float, default=1)
    parser.add_argument("--database", default=None, help="a migrated database URL (default: a fresh SQLite file)")
    parser.add_argument("--dir", default=None, help="folder for the SQLite file (default: a temp dir on the real disk)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(dir=args.dir or os.environ.get("BENCH_DISK_DIR")))
    database = args.database or str(migrated(folder / "contention.sqlite"))
    profile = folder / "worker0.prof"
    arguments = [
        "--database",
        database,
        "--seconds",
        str(args.seconds),
        "--hold-ms",
        str(args.hold_ms),
        "--poll-ms",
        str(args.poll_ms),
        "--policy",
        json.dumps(list(CONTENTION_POLICY.as_tuple())),
    ]
    reports = run_together(
        "benchmarks._contention_worker",
        arguments,
        args.processes,
        args.seconds + 120,
        interpreter_options={0: ["-m", "cProfile", "-o", str(profile)]},
    )
    total = sum(report["turns_in_window"] for report in reports)
    print(
        f"P = {args.processes}: {total / args.seconds:.1f} turns/s in the window; "
        f"worker CPU {sum(report['cpu_s'] for report in reports):.2f} s of {os.cpu_count()} cores x {args.seconds} s"
    )
    for report in reports:
        print(
            f"  worker {report['index']}: {report['turns_in_window']} turns, {report['admission_polls']} polls, "
            f"CPU {report['cpu_s']:.2f} s, errors {report['errors']}"
        )
    units = sum(report["gate_units"] for report in reports)
    if units:
        held = sum(report["gate_held_s"] for report in reports) / units * 1e6
        commit = sum(report["commit_s"] for report in reports) / units * 1e6
        cpu = sum(report["gate_held_cpu_s"] for report in reports) / units * 1e6
        turns = sum(report["turns"] - 1 for report in reports)  # the warm-up turn is not timed
        print(
            f"  writer gate: {units} writing units ({units / max(turns, 1):.2f} a turn), held {held:.0f} us each,"
            f" of which COMMIT {commit:.0f} us; the holder's CPU {cpu:.0f} us each"
        )
    out = io.StringIO()
    stats = pstats.Stats(str(profile), stream=out)
    wall = stats.total_tt  # type: ignore[attr-defined]
    sleeps = _sleep_by_caller(stats)
    execute = sum(own_seconds(stats, f"method '{name}' of") for name in ("execute", "fetchone", "fetchall"))
    commit = own_seconds(stats, "method 'commit' of")
    slept = sum(sleeps.values())
    print(f"worker 0 under cProfile: {wall:.2f} s wall in the profile (warm-up and window)")
    for caller, seconds in sorted(sleeps.items(), key=lambda item: -item[1]):
        print(f"  time.sleep from {caller}: {seconds:.2f} s ({seconds / wall:.0%})")
    rest = wall - slept - execute - commit
    print(
        f"  driver execute/fetch: {execute:.2f} s ({execute / wall:.0%}); "
        f"commit: {commit:.2f} s ({commit / wall:.0%}); "
        f"the rest (Python, and waiting for a CPU): {rest:.2f} s ({rest / wall:.0%})"
    )
    print_profile(stats, out, args.top)


if __name__ == "__main__":
    main()
