"""Profile the lifecycle loop with cProfile: ``python -m benchmarks.profile_lifecycle [--turns N] [--dir D]``.

Runs N full turns through the service (as ``test_lifecycle`` does) under cProfile and
prints the functions by cumulative and by own time, plus the share of the loop spent
inside SQLite's ``execute``/``commit`` (the database's own work, fsync included) versus
Python.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
from pathlib import Path

from admission_plane.evidence import capture

from ._support import TurnDriver, migrated, open_plane, own_seconds, print_profile


def main(argv: list[str] | None = None) -> None:
    """Profile and print."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="folder for the database (default: a temp dir on the real disk)")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(dir=args.dir or os.environ.get("BENCH_DISK_DIR")))
    path = migrated(folder / "profile.sqlite")
    with open_plane(path) as plane:
        driver = TurnDriver(plane, capture(os.getpid()), "profile")
        for _ in range(20):
            driver.turn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.turns):
            driver.turn()
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    total = stats.total_tt  # type: ignore[attr-defined]
    execute = own_seconds(stats, "method 'execute' of 'sqlite3.Cursor'")
    commit = own_seconds(stats, "method 'commit' of 'sqlite3.Connection'")
    print(f"{args.turns} turns in {total:.3f} s profiled ({args.turns / total:.0f} turns/s under the profiler)")
    print(
        f"sqlite3 Cursor.execute: {execute:.3f} s ({execute / total:.0%}); "
        f"Connection.commit: {commit:.3f} s ({commit / total:.0%}); "
        f"everything else (Python): {total - execute - commit:.3f} s ({(total - execute - commit) / total:.0%})"
    )
    print_profile(stats, out, args.top)


if __name__ == "__main__":
    main()
