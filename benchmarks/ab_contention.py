"""Two checkouts side by side: ``python -m benchmarks.ab_contention --database URL --old /tmp/wt-old``.

Runs the contention worker (:mod:`benchmarks._contention_worker`) from each checkout in turn
(``--old`` then this one, then this one and ``--old``, ...: the database grows by every window),
``--rounds`` times at each ``--processes`` count, on one migrated database (``--database``; the schema
must suit both), and prints each window's turns per second and the workers' CPU per turn, then the
median ratio new / old per P. Only figures taken in the same window of this shared machine are
comparable; this keeps them alternating. Make the old checkout with ``git worktree add /tmp/wt-old <commit>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ._support import REPO, run_together


def _window(root: Path, database: str, processes: int, seconds: float, seats: int) -> tuple[float, float]:
    """Turns per second and workers' CPU milliseconds per turn of one window run from ``root``."""
    policy = [seats, seats, 0, 1_800_000, 30_000]
    arguments = ["--database", database, "--seconds", str(seconds), "--policy", json.dumps(policy)]
    reports = run_together("benchmarks._contention_worker", arguments, processes, seconds + 120, root=root)
    turns = sum(report["turns_in_window"] for report in reports)
    cpu = sum(report["cpu_s"] for report in reports)
    return turns / seconds, cpu / max(turns, 1) * 1000


def main(argv: list[str] | None = None) -> None:
    """Alternate the two checkouts and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True, help="a migrated database URL")
    parser.add_argument("--old", required=True, type=Path, help="the other checkout (a git worktree)")
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seats", type=int, default=8)
    args = parser.parse_args(argv)
    for processes in (int(p) for p in args.processes.split(",")):
        ratios = []
        for round_index in range(args.rounds):
            # Old first in even rounds, new first in odd ones: the database grows by every window (its tables and
            # WAL), so a fixed order would always give the second checkout the larger database.
            roots = [("old", args.old), ("new", REPO)][:: -1 if round_index % 2 else 1]
            figures = {
                label: _window(root, args.database, processes, args.seconds, args.seats) for label, root in roots
            }
            old, new = figures["old"], figures["new"]
            ratios.append(new[0] / old[0] if old[0] else float("nan"))
            print(
                f"P = {processes} round {round_index + 1}: old {old[0]:.1f} turns/s ({old[1]:.2f} ms CPU/turn), "
                f"new {new[0]:.1f} turns/s ({new[1]:.2f} ms CPU/turn)",
                flush=True,
            )
        print(f"P = {processes}: median new / old = {statistics.median(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
