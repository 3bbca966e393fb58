"""Client and server CPU per turn: ``python -m benchmarks.cpu_split --database URL`` (or ``--sqlite``).

Runs P contention workers (:mod:`benchmarks._contention_worker`) on one migrated PostgreSQL database
(``--database``; it is truncated before each window, as ``pg_scale`` does) or, with ``--sqlite``, on a
fresh SQLite file per window (in ``--dir``, default a temporary folder on the real disk), and prints, per
window, the turns per second, the workers' CPU per turn (what each worker reports), their context
switches per turn (voluntary: they blocked; involuntary: the kernel took the CPU from a runnable worker),
their admission looks that did not admit per turn (0: nobody waited for a seat), and on PostgreSQL the
server's CPU per turn: the growth of user and system CPU of every process named ``postgres`` on this
machine, read from ``/proc`` before and after the window, the postmaster's reaped children included (so
backends that exited with their workers count). Run it only against a server on this machine, with
nothing else using it: every ``postgres`` process is counted. With ``--old`` it alternates two checkouts,
as :mod:`benchmarks.ab_contention` does, so their figures come from neighbouring windows.

With ``--seats`` at least the largest P, every turn's path is the same at every P (nobody waits), so the
CPU per turn at P > 1 against P = 1 is what running side by side costs on this machine.

With ``--locks`` (PostgreSQL) it samples what the backends wait for instead of the server's CPU
(:mod:`benchmarks._lock_sampler`): how many held or waited for each of the plane's gates at an instant, on
average, and how long each turn held the admission gate exclusively.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ._lock_sampler import LockSampler
from ._support import REPO, migrated, run_together
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


def window(
    root: Path, database: str | Path, processes: int, seconds: float, seats: int, *, locks: bool = False
) -> dict[str, float]:
    """One window from the checkout ``root``: turns per second, CPU milliseconds per turn, and per turn the
    workers' context switches and the admission looks that did not admit. ``database``: a migrated
    PostgreSQL URL (truncated first; the server's CPU is measured too, or with ``locks`` what its backends
    wait for) or a folder, where the window gets a fresh SQLite file of its own."""
    if not str(database).startswith("postgresql"):
        if locks:
            raise ValueError("lock sampling needs a PostgreSQL database")
        with tempfile.TemporaryDirectory(dir=database) as folder:
            return _window(root, migrated(Path(folder) / "cpu_split.sqlite"), processes, seconds, seats)
    _truncate(str(database))
    if not locks:
        return _window(root, database, processes, seconds, seats, server=True)
    sampler = LockSampler(str(database), seconds)
    try:
        figures = _window(root, database, processes, seconds, seats, on_go=sampler.start)
    finally:
        waits = sampler.stop()
    held = waits.get("admission_gate_exclusive_held", 0.0)
    per_turn = held / figures["turns_per_s"] * 1000 if figures["turns_per_s"] else 0.0
    return {**figures, **waits, "admission_gate_exclusive_ms_per_turn": per_turn}


def _window(
    root: Path,
    database: str | Path,
    processes: int,
    seconds: float,
    seats: int,
    *,
    server: bool = False,
    on_go: Callable[[], object] | None = None,
) -> dict[str, float]:
    policy = [seats, seats, 0, 1_800_000, 30_000]
    arguments = ["--database", str(database), "--seconds", str(seconds), "--policy", json.dumps(policy)]
    before = server_cpu_seconds() if server else 0.0
    reports = run_together("benchmarks._contention_worker", arguments, processes, seconds + 180, root=root, on_go=on_go)
    spent = server_cpu_seconds() - before if server else 0.0
    turns = max(sum(report["turns"] for report in reports), 1)

    def per_turn(field: str) -> float:
        return sum(report.get(field, 0) for report in reports) / turns

    figures = {
        "turns_per_s": sum(report["turns_in_window"] for report in reports) / seconds,
        "client_ms_per_turn": per_turn("cpu_s") * 1000,
        "voluntary_switches_per_turn": per_turn("voluntary_switches"),
        "involuntary_switches_per_turn": per_turn("involuntary_switches"),
        "looks_per_turn": per_turn("admission_polls"),
    }
    return {**figures, "server_ms_per_turn": spent / turns * 1000} if server else figures


def main(argv: list[str] | None = None) -> None:
    """Print each window's figures (one JSON line each)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--database", help="a migrated PostgreSQL database URL on this machine")
    target.add_argument("--sqlite", action="store_true", help="a fresh SQLite file per window, in --dir")
    parser.add_argument("--dir", help="with --sqlite: the folder for the files (default: a temporary one on disk)")
    parser.add_argument("--old", type=Path, help="another checkout to alternate with (a git worktree)")
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--seats", type=int, default=8)
    parser.add_argument("--locks", action="store_true", help="sample the gates' holders and waiters (PostgreSQL)")
    args = parser.parse_args(argv)
    if args.locks and args.sqlite:
        parser.error("--locks samples a PostgreSQL server's locks")
    roots = {"new": REPO} if args.old is None else {"old": args.old.resolve(), "new": REPO}
    database: str | Path = args.database or Path(tempfile.mkdtemp(dir=args.dir or os.environ.get("BENCH_DISK_DIR")))
    counts = [int(p) for p in args.processes.split(",") if p]
    for number in range(args.rounds):  # round by round, so every P and checkout sees the same neighbours
        for processes in counts:
            # Alternate which checkout goes first: a PostgreSQL database grows by every window (its requests and
            # journal), so a fixed order would always give the second checkout the larger one.
            for label, root in list(roots.items())[:: -1 if number % 2 else 1]:
                figures = window(root, database, processes, args.seconds, args.seats, locks=args.locks)
                rounded = {name: round(value, 3) for name, value in figures.items()}
                print(json.dumps({"P": processes, "round": number + 1, "checkout": label, **rounded}), flush=True)
                time.sleep(0.5)


if __name__ == "__main__":
    main()
