"""Client and server CPU per turn on PostgreSQL: ``python -m benchmarks.cpu_split --database URL``.

Runs P contention workers (:mod:`benchmarks._contention_worker`) on one migrated database
(``--database``; it is truncated before each window, as ``pg_scale`` does) and prints, per window,
the turns per second, the workers' CPU per turn (what each worker reports) and the server's CPU per
turn: the growth of user and system CPU of every process named ``postgres`` on this machine, read from
``/proc`` before and after the window, the postmaster's reaped children included (so backends that
exited with their workers count). Run it only against a server on this machine, with nothing else
using it: every ``postgres`` process is counted. With ``--old`` it alternates two checkouts, as
:mod:`benchmarks.ab_contention` does, so their figures come from neighbouring windows.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ._support import REPO, run_together
from .pg_scale import _truncate

_TICKS = os.sysconf("SC_CLK_TCK")


def server_cpu_seconds() -> float:
    """User and system CPU seconds of every ``postgres`` process, with the children each has reaped."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:  # gone since the listing
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name.startswith("postgres"):
            total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return total / _TICKS


def window(root: Path, database: str, processes: int, seconds: float, seats: int) -> dict[str, float]:
    """One window from the checkout ``root``: turns per second and CPU milliseconds per turn."""
    _truncate(database)
    policy = [seats, seats, 0, 1_800_000, 30_000]
    arguments = ["--database", database, "--seconds", str(seconds), "--policy", json.dumps(policy)]
    before = server_cpu_seconds()
    reports = run_together("benchmarks._contention_worker", arguments, processes, seconds + 180, root=root)
    server = server_cpu_seconds() - before
    turns = max(sum(report["turns"] for report in reports), 1)
    return {
        "turns_per_s": sum(report["turns_in_window"] for report in reports) / seconds,
        "client_ms_per_turn": sum(report["cpu_s"] for report in reports) / turns * 1000,
        "server_ms_per_turn": server / turns * 1000,
    }


def main(argv: list[str] | None = None) -> None:
    """Print each window's figures (one JSON line each)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, help="a migrated PostgreSQL database URL on this machine")
    parser.add_argument("--old", type=Path, help="another checkout to alternate with (a git worktree)")
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--seats", type=int, default=8)
    args = parser.parse_args(argv)
    roots = {"new": REPO} if args.old is None else {"old": args.old.resolve(), "new": REPO}
    for processes in (int(p) for p in args.processes.split(",") if p):
        for number in range(args.rounds):
            for label, root in roots.items():
                figures = window(root, args.database, processes, args.seconds, args.seats)
                print(json.dumps({"P": processes, "round": number + 1, "checkout": label, **figures}), flush=True)
                time.sleep(0.5)


if __name__ == "__main__":
    main()
