"""One process of the raw PostgreSQL commit rate (``python -m benchmarks._raw_commit_worker``).

The smallest durable transaction: one one-row ``INSERT`` and ``COMMIT`` with
``synchronous_commit = on``, in a loop, on its own connection (psycopg, prepared). Same
protocol as the contention worker: it prints ``ready``, waits for ``go``, runs for
``--seconds`` and prints one JSON line with its commits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import psycopg

TABLE = "raw_commits"


def main(argv: list[str] | None = None) -> int:
    """Connect, report ready, wait for ``go``, commit one row per transaction until the time is up."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True, help="libpq URL (postgresql://...)")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    with psycopg.connect(args.database, prepare_threshold=0) as connection:
        connection.execute("SET synchronous_commit = on")
        connection.commit()
        insert = f"INSERT INTO {TABLE} (worker, n) VALUES (%s, %s)"
        connection.execute(insert, (args.index, -1))
        connection.commit()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        commits = 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            connection.execute(insert, (args.index, commits))
            connection.commit()
            commits += 1
    print(json.dumps({"index": args.index, "commits": commits, "seconds": args.seconds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
