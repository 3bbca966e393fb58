"""PostgreSQL: a unit of work keeps its connection for the engine's next unit (``store.parking``).

A connector runs its units back to back, and borrowing a connection from SQLAlchemy's pool and giving it
back costs more of its CPU than any other part of a unit on the client. These tests check what a user
relies on once units keep a connection between them: back-to-back units use one connection without the
pool; a connection kept too long goes back to the pool, whose idle ping then counts from when it was
kept; disposing of the engine closes it; a failed unit, a pool that can lend one connection only, or a
pool that could lend no other keep nothing; threads never share one; a forked child never uses its
parent's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dbutil import POSTGRES_ONLY
from sqlalchemy import Engine, event, func, select

from admission_plane.store import parking
from admission_plane.store.engine import create_admission_engine
from admission_plane.store.tx import Scalar, Tx
from admission_plane.store.unit_of_work import Gate, run

pytestmark = POSTGRES_ONLY
BACKEND: Scalar[int] = Scalar(select(func.pg_backend_pid()))


def backend(tx: Tx) -> int:
    """The server process of the unit's connection."""
    pid = tx.scalar(BACKEND)
    assert isinstance(pid, int)
    return pid


class Lending:
    """The pool's checkouts and checkins of an engine, and the idle time its checkouts saw."""

    def __init__(self, engine: Engine) -> None:
        self.checkouts = 0
        self.checkins = 0
        self.idle_since: list[float | None] = []
        event.listen(engine, "checkout", self._checkout)
        event.listen(engine, "checkin", self._checkin)

    def _checkout(self, _dbapi: Any, record: Any, _proxy: Any) -> None:
        self.checkouts += 1
        self.idle_since.append(record.info.get("idle_since"))

    def _checkin(self, _dbapi: Any, _record: Any) -> None:
        self.checkins += 1


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine as a plane makes it (the default pool: 5 connections and 10 more on demand)."""
    made = create_admission_engine(database_url)
    yield made
    made.dispose()


def test_back_to_back_units_use_one_connection_without_the_pool(engine: Engine) -> None:
    """After the first unit borrows a connection, the next units (read-only and writing, under any gate) run
    on it without a checkout or a checkin; the pool counts it as checked out."""
    lending = Lending(engine)
    pids = {run(engine, backend, read_only=True)}
    for gate in (Gate.LEASE, Gate.ENQUEUE, Gate.ADMISSION, Gate.EXCLUSIVE, None):
        pids.add(run(engine, backend, gate=gate))
    assert len(pids) == 1
    assert (lending.checkouts, lending.checkins) == (1, 0)
    assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]


def test_a_connection_kept_too_long_goes_back_and_its_idle_time_counts_from_when_it_was_kept(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept connection older than the idle-ping limit is given back to the pool at the next unit, which
    borrows it again; the checkout sees it idle since it was kept (so it is pinged as any connection idle
    that long), not since the moment it was given back."""
    lending = Lending(engine)
    run(engine, backend)
    kept_by = time.monotonic()
    time.sleep(0.05)
    kept = parking.parking_for(engine)
    assert kept is not None
    monkeypatch.setattr(kept, "_stale_after_s", 0.01)
    run(engine, backend)
    assert (lending.checkouts, lending.checkins) == (2, 1)
    since = lending.idle_since[-1]
    assert since is not None
    assert since <= kept_by


def test_disposing_of_the_engine_closes_the_kept_connection(engine: Engine) -> None:
    """``Engine.dispose`` closes a kept connection, as the pool closes those it holds."""
    run(engine, backend)
    kept = parking.parking_for(engine)
    assert kept is not None
    connection = kept.take()
    assert connection is not None
    raw = connection.dbapi_connection
    assert kept.keep(connection, engine.pool)
    engine.dispose()
    assert raw is not None
    assert raw.closed
    assert kept.take() is None


def test_a_failed_unit_gives_its_connection_back(engine: Engine) -> None:
    """A unit whose work raised rolls back and returns its connection to the pool; the next unit borrows."""
    lending = Lending(engine)

    def fails(tx: Tx) -> None:
        backend(tx)
        raise LookupError("the operation refused")

    with pytest.raises(LookupError):
        run(engine, fails)
    assert (lending.checkouts, lending.checkins) == (1, 1)
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_a_pool_of_one_connection_keeps_none(database_url: str) -> None:
    """A pool that lends one connection at most never has it kept: it is there for the next borrower."""
    single = create_admission_engine(database_url, pool_size=1, max_overflow=0)
    try:
        assert parking.parking_for(single) is None
        run(single, backend)
        assert single.pool.checkedout() == 0  # type: ignore[attr-defined]
        with single.connect():
            pass
    finally:
        single.dispose()


def test_a_connection_is_not_kept_when_the_pool_could_lend_no_other(database_url: str) -> None:
    """With two connections at most and one borrowed elsewhere, a unit gives its connection back: keeping it
    would leave the pool nothing to lend."""
    pair = create_admission_engine(database_url, pool_size=2, max_overflow=0)
    try:
        with pair.connect():
            run(pair, backend)
            assert pair.pool.checkedout() == 1  # type: ignore[attr-defined]
        run(pair, backend)
        assert pair.pool.checkedout() == 1  # type: ignore[attr-defined]  # kept: the other can be lent
        with pair.connect():
            pass
    finally:
        pair.dispose()


def test_threads_never_share_a_kept_connection(engine: Engine) -> None:
    """Units of four threads at once: no server process ever serves two units at the same moment."""
    busy: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def unit(tx: Tx) -> None:
        pid = backend(tx)
        with lock:
            if pid in busy:
                errors.append(f"backend {pid} serves threads {busy[pid]} and {threading.get_ident()}")
            busy[pid] = threading.get_ident()
        time.sleep(0.001)
        with lock:
            busy.pop(pid, None)

    def units() -> None:
        for _ in range(40):
            run(engine, unit, gate=Gate.LEASE)

    threads = [threading.Thread(target=units) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_forked_child_never_uses_its_parents_kept_connection(engine: Engine) -> None:
    """In a child made by ``fork``, the parent's kept connection is not handed out (nor closed); the parent
    goes on using it."""
    first = run(engine, backend)
    kept = parking.parking_for(engine)
    assert kept is not None
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status only
        os._exit(0 if kept.take() is None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run(engine, backend) == first
