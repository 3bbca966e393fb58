"""What one ring costs the PostgreSQL server per listening connection: ``python -m benchmarks.listener_fanout``.

Every waiting plane listens on :data:`admission_plane.store.doorbell.CHANNEL` through a connection of its own,
and PostgreSQL 15 signals every listening backend of the database at every ``NOTIFY`` that commits, whatever
its channel. So a ring costs the server once per listening connection, on every host. This measures that
alone, without the plane: ``M`` idle connections ``LISTEN`` on a probe channel (their clients never read, as
a busy connector's thread may not for a while; the backends still wake, read the notification queue and send
the notification to their socket), and one connection commits ``--rings`` transactions that each send one
``NOTIFY``. The server's CPU is read from ``/proc`` as :mod:`benchmarks.cpu_split` reads it (every process
named ``postgres`` on this machine: run it against a server on this machine that nothing else uses). It prints,
per ``M``, the server's CPU per ringing commit and, against ``M = 0`` of the same run, per commit and listener.
After each window every listener must have heard every notification, or it raises.

The database is the admin URL's own (``ADMISSION_PLANE_TEST_POSTGRES_URL``, default the ``test`` database);
nothing is written to a table, and the probe channel is not the plane's, so no plane is disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import psycopg

from ._lock_sampler import libpq_dsn
from ._support import DEFAULT_POSTGRES_ADMIN_URL, POSTGRES_URL_VARIABLE
from .cpu_split import server_cpu_seconds

#: The probe's channel: not the plane's, so that no plane's listener counts these rings.
PROBE_CHANNEL = "admission_plane_fanout_probe"
_WARM_UP = 50


def window(dsn: str, listeners: int, rings: int) -> dict[str, float]:
    """``rings`` commits, each with one ``NOTIFY``, while ``listeners`` other connections listen."""
    idle = [psycopg.connect(dsn, autocommit=True) for _ in range(listeners)]
    try:
        for connection in idle:
            connection.execute(f"LISTEN {PROBE_CHANNEL}")
        with psycopg.connect(dsn) as writer:
            for _ in range(_WARM_UP):  # warm up: the statement, the connection, the notification queue
                writer.execute(f"NOTIFY {PROBE_CHANNEL}")
                writer.commit()
            time.sleep(0.2)  # let the listeners' backends drain the warm-up
            before, started = server_cpu_seconds(), time.perf_counter()
            for _ in range(rings):
                writer.execute(f"NOTIFY {PROBE_CHANNEL}")
                writer.commit()
            time.sleep(0.5)  # the listeners' backends handle their signals after the writer's commits return
            cpu, wall = server_cpu_seconds() - before, time.perf_counter() - started
        sent = _WARM_UP + rings
        for connection in idle:  # after the window: the probe measured what it says only if every listener heard all
            heard = sum(1 for _ in connection.notifies(timeout=5.0, stop_after=sent))
            if heard != sent:
                raise RuntimeError(f"a listener heard {heard} of {sent} notifications")
    finally:
        for connection in idle:
            connection.close()
    return {"listeners": listeners, "rings": rings, "server_ms_per_ring": 1000 * cpu / rings, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default=os.environ.get(POSTGRES_URL_VARIABLE, DEFAULT_POSTGRES_ADMIN_URL))
    parser.add_argument("--listeners", default="0,8,32,128", help="comma-separated counts of listening connections")
    parser.add_argument("--rings", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    dsn, _ = libpq_dsn(options.database)
    counts = [int(value) for value in options.listeners.split(",") if value]
    base: list[float] = []
    for round_ in range(options.rounds):
        for count in counts:
            figures = window(dsn, count, options.rings)
            if count == 0:
                base.append(figures["server_ms_per_ring"])
            elif base:
                extra = figures["server_ms_per_ring"] - base[-1]
                figures["server_us_per_ring_and_listener"] = 1000 * extra / count
            print(json.dumps({"round": round_ + 1, **figures}), flush=True)


if __name__ == "__main__":
    main()
