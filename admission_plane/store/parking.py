"""PostgreSQL: the connection a unit of work gave back, kept for the engine's next unit.

Why: a unit of work borrows a connection from the engine's pool and gives it back, and SQLAlchemy's
``QueuePool`` does that in Python (a queue under a condition, a proxy object, the checkout and checkin
events, the rollback of the reset on return, psycopg's autocommit switched on and off): about 45 µs
of a connector's CPU per unit, a sixth of all it spends on a turn of five units (measured with
``py-spy`` on ``benchmarks._contention_worker``, PostgreSQL, one process). A connector runs its units
back to back, so the connection its last unit gave back is the one its next unit would borrow.

What is kept, per engine made by :func:`~admission_plane.store.engine.create_admission_engine` on
PostgreSQL with its default ``QueuePool`` (and without ``pool_pre_ping``): at most :data:`KEPT_MAX`
connections a unit left with no transaction open, in psycopg's autocommit mode, as units use them. The
pool counts a kept connection as checked out, so a connection is kept only while the pool could still lend
another without waiting (never by a pool that lends one connection at most, ``pool_size=1,
max_overflow=0``), and the next unit, of any thread, takes it. When a kept connection is not what a unit
should get:

* it has been kept for :data:`~admission_plane.store.engine.PING_AFTER_IDLE_S` or longer: it goes
  back to the pool, which pings it at its next checkout as it pings any connection idle that long
  (its idle time counts from when it was kept);
* this is not the process that kept it (a fork): it is never used, closed or dropped here (closing
  it would end the parent's session); the child's units borrow from the pool;
* the engine is disposed of (``Engine.dispose``): each kept connection is closed, as the pool closes
  the connections it holds; by the process that kept it only.

A unit whose work or commit raised gives its connection to the pool as before (one that lost its
connection discards it); only a unit that ended as planned, with no transaction left open, keeps it.
``checkout`` and ``checkin`` pool events fire for the pool's own lending only, not each time a kept
connection serves a unit.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import PoolProxiedConnection, QueuePool

#: How many connections an engine keeps at most (one per connector thread running units back to back).
KEPT_MAX = 1
#: ``record.info`` key: when a connection given back by :meth:`Parking.take` was kept, so that the idle
#: ping counts its idle time from then (read by the engine's ``checkin`` listener).
KEPT_SINCE = "admission_plane_kept_since"
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open on the connection

_PARKINGS: weakref.WeakKeyDictionary[Engine, Parking] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class Parking:
    """The connections one engine keeps between units (see the module docstring)."""

    __slots__ = ("__weakref__", "_capacity", "_engine", "_kept", "_pid", "_stale_after_s")

    def __init__(self, engine: Engine, stale_after_s: float, capacity: int | None) -> None:
        self._engine = weakref.ref(engine)
        self._kept: deque[tuple[PoolProxiedConnection, QueuePool, float]] = deque()
        self._pid = os.getpid()
        self._stale_after_s = stale_after_s
        self._capacity = capacity

    def take(self) -> PoolProxiedConnection | None:
        """A kept connection for a unit, or ``None`` (borrow from the pool)."""
        if not self._kept or os.getpid() != self._pid:
            return None
        try:
            connection, pool, since = self._kept.pop()
        except IndexError:  # another thread took it first
            return None
        engine = self._engine()
        if engine is None or pool is not engine.pool or time.monotonic() - since >= self._stale_after_s:
            give_back(connection, since)
            return None
        return connection

    def keep(self, connection: PoolProxiedConnection, pool: QueuePool) -> bool:
        """Keep ``connection``, borrowed from ``pool`` and left idle by a unit; ``False``: give it back."""
        engine = self._engine()
        if engine is None or pool is not engine.pool or len(self._kept) >= KEPT_MAX or os.getpid() != self._pid:
            return False
        if self._capacity is not None and pool.checkedout() >= self._capacity:
            return False  # the pool could lend no other connection without waiting: never starve it
        self._kept.append((connection, pool, time.monotonic()))
        return True

    def close_all(self) -> None:
        """Close every kept connection (the engine was disposed of); in the process that kept them only."""
        if os.getpid() != self._pid:
            return
        while True:
            try:
                connection, _pool, _since = self._kept.pop()
            except IndexError:
                return
            connection.invalidate()


def give_back(connection: PoolProxiedConnection, since: float | None = None) -> None:
    """Give a PostgreSQL connection a unit used back to its pool, in the mode the pool lent it (psycopg's
    autocommit off); ``since``: when it was kept idle, so the pool's idle ping counts from then."""
    raw: Any = connection.dbapi_connection
    if raw is not None and not raw.closed and raw.autocommit and raw.pgconn.transaction_status == _IDLE:
        raw.autocommit = False  # (in a transaction, left to the pool's reset, which rolls it back)
    if since is not None:
        connection.info[KEPT_SINCE] = since
    connection.close()


def enable(engine: Engine, stale_after_s: float, pool_size: int, max_overflow: int) -> None:
    """Let units of ``engine`` keep a connection between them, if its pool is a ``QueuePool`` that can lend
    two connections or more at once (``pool_size`` + ``max_overflow``; unbounded when ``max_overflow`` is
    negative)."""
    capacity = None if max_overflow < 0 else pool_size + max_overflow
    if type(engine.pool) is not QueuePool or (capacity is not None and capacity < 2):
        return
    parking = Parking(engine, stale_after_s, capacity)
    with _LOCK:
        _PARKINGS[engine] = parking
    event.listen(engine, "engine_disposed", lambda _engine: parking.close_all())


def parking_for(engine: Engine) -> Parking | None:
    """The engine's :class:`Parking`, or ``None`` where units do not keep connections."""
    return _PARKINGS.get(engine)
