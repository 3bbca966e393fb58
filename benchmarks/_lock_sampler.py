"""What a PostgreSQL plane's backends wait for: sample ``pg_locks`` and ``pg_stat_activity`` during a window.

:class:`LockSampler` runs in a thread of the benchmark process, on its own connection, and every
``interval`` seconds reads, for the backends connected to the window's database:

* the plane's advisory locks (the admission gate, the lease gate, the start and drain locks of
  :mod:`admission_plane.store.unit_of_work`) and the listeners' lock of the doorbell, by mode, held or
  waited for;
* the lock PostgreSQL takes at the commit of a transaction that sent ``NOTIFY`` (an
  ``AccessExclusiveLock`` on the database object, ``pg_database`` 0): ``NOTIFY``ing commits run one at a time;
* every backend's state: on the CPU (active and waiting for nothing), waiting for a lock, a lightweight
  lock or I/O, or idle (the connector holds the turn: its Python, or nothing to do).

Each figure is a mean over the samples: how many backends were in that state at an instant. ``held`` of an
exclusive gate is thus the share of the window it was held; divided by the window's turns per second it is
how long one turn held it. Sampling costs the server CPU (two catalogue reads every ``interval``), so a
window that samples does not report the server's CPU per turn.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy.engine import make_url

from admission_plane.store.advisory import (
    ADVISORY_LOCK_KEY,
    DRAIN_LOCK_KEY,
    LEASE_LOCK_KEY,
    LISTENING_KEY,
    START_LOCK_KEY,
)

#: The advisory keys the plane takes, by the name the figures use.
GATES = {
    ADVISORY_LOCK_KEY: "admission_gate",
    LEASE_LOCK_KEY: "lease_gate",
    START_LOCK_KEY: "start_lock",
    DRAIN_LOCK_KEY: "drain_lock",
    LISTENING_KEY: "listeners_lock",
}
_PG_DATABASE = 1262  # pg_database's OID: the NOTIFY commit lock is an object lock on database 0
_MODES = {"ExclusiveLock": "exclusive", "ShareLock": "shared", "AccessExclusiveLock": "exclusive"}
_LOCKS = """
SELECT l.locktype, l.classid, l.objid, l.mode, l.granted
FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE a.datname = %(database)s AND (l.locktype = 'advisory' OR (l.locktype = 'object' AND l.classid = %(pg_database)s))
"""
_STATES = """
SELECT state, wait_event_type FROM pg_stat_activity
WHERE datname = %(database)s AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


def libpq_dsn(url: str) -> tuple[str, str]:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL, and its database name."""
    parsed = make_url(url)
    if parsed.database is None:
        raise ValueError("the database URL names no database")
    plain = parsed.set(drivername="postgresql")
    return plain.render_as_string(hide_password=False), parsed.database


def _lock_name(locktype: str, classid: int, objid: int) -> str | None:
    if locktype == "object":
        return "notify_lock" if objid == 0 else None
    return GATES.get((classid << 32) | objid)


def backend_state(state: str | None, wait_event_type: str | None) -> str:
    """One backend's state as the figures name it (``backends_<state>``)."""
    if state != "active":
        return "idle"  # waiting for its connector: the connector's Python, or a turn between units
    if wait_event_type is None:
        return "on_cpu"
    return {"Lock": "lock", "LWLock": "lwlock", "IO": "io"}.get(wait_event_type, "other")


class LockSampler:
    """Sample the window's database from a thread for ``seconds`` after :meth:`start`; :meth:`stop`
    returns the mean figures. It connects when made, so the window's start is not spent connecting."""

    def __init__(self, url: str, seconds: float, *, interval: float = 0.005) -> None:
        import psycopg  # the PostgreSQL extra; only this benchmark's PostgreSQL windows need it

        dsn, self._database = libpq_dsn(url)
        self._connection = psycopg.connect(dsn, autocommit=True)
        self._seconds = seconds
        self._interval = interval
        self._counts: Counter[str] = Counter()
        self._samples = 0
        self._stop = threading.Event()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="lock-sampler", daemon=True)

    def start(self) -> LockSampler:
        """Begin sampling."""
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._sample()
        except Exception as error:  # noqa: BLE001 - stop() re-raises it: a window must not pass unsampled
            self._error = error

    def _sample(self) -> None:
        parameters: dict[str, Any] = {"database": self._database, "pg_database": _PG_DATABASE}
        deadline = time.monotonic() + self._seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            for locktype, classid, objid, mode, granted in self._connection.execute(_LOCKS, parameters):
                name = _lock_name(locktype, int(classid), int(objid))
                if name is not None:
                    status = "held" if granted else "waiting"
                    self._counts[f"{name}_{_MODES.get(mode, mode)}_{status}"] += 1
            for state, wait_event_type in self._connection.execute(_STATES, parameters):
                self._counts[f"backends_{backend_state(state, wait_event_type)}"] += 1
            self._samples += 1
            self._stop.wait(self._interval)

    def stop(self) -> dict[str, float]:
        """Stop, close the connection, and return each figure's mean over the samples (absent: 0)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        self._connection.close()
        if self._error is not None:
            raise RuntimeError("the lock sampler failed") from self._error
        samples = max(self._samples, 1)
        figures = {name: count / samples for name, count in sorted(self._counts.items())}
        return {"lock_samples": float(self._samples), **figures}
