"""Group commit outside the gates (``admission_plane.store.group_commit``).

SQLite: a writing unit commits under the writer gate with ``synchronous=NORMAL`` and flushes the ``-wal`` file
after leaving it, before the operation returns. PostgreSQL: a unit that holds the admission gate at its commit
commits without awaiting the flush (the gate is released with the commit) and the same round trip flushes.

The flush is observed by wrapping ``os.fdatasync`` around the real call (the real file, the real gate, the real
flush): what the wrapper sees at that moment (is the gate free, is the commit visible to another connection) is
what the ordering promises. A failing disk is the one thing that cannot run here: the last tests make the real call
fail in its place and say so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from dbutil import POSTGRES_ONLY, pg_engine
from planes import activate, dispatch_record, enqueue
from sqlalchemy import text

from admission_plane import AdmissionDatabaseError, AdmissionPlane, LiveTurnCompletion, Policy
from admission_plane.store import group_commit
from admission_plane.store.engine import writer_lock_path

#: No start interval: an enqueue with ``admit_as`` admits at once (on PostgreSQL, decided by the server).
ROOMY = Policy(8, 8, 0, 1_800_000, 30_000)
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


class Flushes:
    """``os.fdatasync`` as the plane calls it, wrapped: what each call flushed and what held at that moment."""

    def __init__(self, database: str, gate: str) -> None:
        self.database, self.gate = database, gate
        self.calls: list[dict[str, Any]] = []
        self.fail_with: int | None = None
        self.real: Callable[[int], None] = os.fdatasync

    def __call__(self, fd: int) -> None:
        self.calls.append(
            {
                "file": os.readlink(f"/proc/self/fd/{fd}"),
                "gate_free": self._gate_free(),
                "requests_visible": self._requests_visible(),
            }
        )
        if self.fail_with is not None:
            raise OSError(self.fail_with, os.strerror(self.fail_with))
        self.real(fd)

    def _gate_free(self) -> bool:
        fd = os.open(self.gate, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # releases the probe's lock, if it got it
        return True

    def _requests_visible(self) -> list[str]:
        with closing(sqlite3.connect(self.database)) as reader:
            return [row[0] for row in reader.execute("SELECT request_id FROM turn_requests ORDER BY request_id")]


@pytest.fixture
def flushes(plane: AdmissionPlane, monkeypatch: pytest.MonkeyPatch) -> Flushes:
    database = plane.engine.url.database
    gate = writer_lock_path(plane.engine)
    assert database is not None
    assert gate is not None
    enqueue(plane, "warm-up")  # the gate file exists, the connection is pooled
    spy = Flushes(database, gate)
    monkeypatch.setattr(group_commit.os, "fdatasync", spy)
    return spy


@SQLITE_ONLY
def test_a_writing_operation_flushes_the_wal_once_after_the_gate_and_before_it_returns(
    plane: AdmissionPlane, flushes: Flushes
) -> None:
    """One flush per writing operation, of the database's ``-wal`` file, while no writer holds the gate (it was
    left first) and with the commit already visible to other connections; done by the time the operation returns."""
    enqueue(plane, "request-1")
    assert flushes.calls == [
        {
            "file": os.path.realpath(group_commit.wal_path(flushes.database)),
            "gate_free": True,
            "requests_visible": ["request-1", "warm-up"],
        }
    ]


@SQLITE_ONLY
def test_reading_operations_never_flush(plane: AdmissionPlane, flushes: Flushes) -> None:
    """Reads commit nothing, so they flush nothing."""
    assert plane.get_request("warm-up") is not None
    assert plane.read_sanitized_events(after_event_seq=0, limit=10)
    assert plane.admit_request("warm-up", 2_000, "owner-1") is not None  # a write: the one flush below
    assert len(flushes.calls) == 1


@SQLITE_ONLY
def test_only_the_unit_of_work_commits_relaxed(plane: AdmissionPlane) -> None:
    """The unit's pooled connection is left in ``synchronous=NORMAL``; any transaction begun through a SQLAlchemy
    connection (migrations, the operator's paths) puts it back to ``FULL`` first, so SQLite flushes those itself."""
    enqueue(plane, "request-1")
    raw = plane.engine.raw_connection()
    try:
        assert raw.info[group_commit.SYNCHRONOUS_INFO] == group_commit.RELAXED
        assert raw.dbapi_connection.execute("PRAGMA synchronous").fetchone() == (1,)
    finally:
        raw.close()
    with plane.engine.connect() as connection:
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 2
    enqueue(plane, "request-2")  # and the next unit relaxes it again
    raw = plane.engine.raw_connection()
    try:
        assert raw.dbapi_connection.execute("PRAGMA synchronous").fetchone() == (1,)
    finally:
        raw.close()


def test_a_connection_not_in_wal_mode_keeps_full(tmp_path: Path) -> None:
    """With a rollback journal (``journal_mode=WAL`` refused) ``NORMAL`` would weaken a commit: nothing is relaxed."""
    with closing(sqlite3.connect(tmp_path / "rollback.sqlite", isolation_level=None)) as connection:
        connection.execute("PRAGMA synchronous = FULL")
        (journal_mode,) = connection.execute("PRAGMA journal_mode = DELETE").fetchone()
        info: dict[str, object] = {group_commit.WAL_INFO: group_commit.wal_file(connection, journal_mode)}
        assert info == {group_commit.WAL_INFO: None}
        assert group_commit.relaxed(connection, info) is None
        assert connection.execute("PRAGMA synchronous").fetchone() == (2,)
        assert info == {group_commit.WAL_INFO: None}


def test_a_missing_wal_file_needs_no_flush(tmp_path: Path) -> None:
    """A ``-wal`` file checkpointed and removed holds nothing to flush: no error."""
    group_commit.make_durable(group_commit.wal_path(str(tmp_path / "gone.sqlite")))


def test_a_wal_path_that_is_not_a_regular_file_fails_loudly_without_blocking(tmp_path: Path) -> None:
    """A FIFO planted at the ``-wal`` path is opened without blocking and its flush refused: the error says the
    commit may not be durable, rather than the operation hanging or claiming durability."""
    database = tmp_path / "planted.sqlite"
    os.mkfifo(group_commit.wal_path(str(database)))
    with pytest.raises(AdmissionDatabaseError, match="may not survive a power loss"):
        group_commit.make_durable(group_commit.wal_path(str(database)))


@SQLITE_ONLY
def test_a_failed_flush_fails_the_operation_but_the_commit_stands(plane: AdmissionPlane, flushes: Flushes) -> None:
    """A disk error on the flush (simulated: ``EIO`` raised in place of the real call, a failing disk being what
    cannot run here) reaches the caller as :class:`AdmissionDatabaseError`, not as success; the commit it could not
    make durable stands (as after a lost connection: it happened, its durability is unknown), and the plane goes on."""
    flushes.fail_with = errno.EIO
    with pytest.raises(AdmissionDatabaseError, match=r"flushing the SQLite -wal file failed \(EIO\)"):
        enqueue(plane, "request-1")
    assert flushes.calls[-1]["requests_visible"] == ["request-1", "warm-up"]
    flushes.fail_with = None
    enqueue(plane, "request-2")
    stored = plane.get_request("request-2")
    assert stored is not None
    assert stored.state == "queued"


# --- PostgreSQL ----------------------------------------------------------------------------------------------


def _inserted_then_flushed(database_url: str, between: str) -> bool:
    """On one connection: a row committed asynchronously, the WAL position after it read at once (on a shared
    server others write too: the position is at or past every record inserted so far, this commit's included),
    then ``between``; whether the server has flushed its WAL that far (the WAL writer may have, on its own, by then:
    a ``True`` without ``between`` proves nothing, a ``False`` with it disproves the flush)."""
    with pg_engine(database_url).connect() as connection:
        raw = connection.connection.dbapi_connection
        assert raw is not None
        connection.commit()
        raw.autocommit = True
        try:
            raw.execute(f"CREATE TABLE IF NOT EXISTS {_LOGGED} (n int)")
            raw.execute(f"BEGIN; {group_commit.POSTGRES_ASYNC}; INSERT INTO {_LOGGED} VALUES (1); COMMIT")
            written = raw.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            if between:
                raw.execute(between)
            return bool(raw.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [written]).fetchone()[0])
        finally:
            raw.execute(f"DROP TABLE IF EXISTS {_LOGGED}")
            raw.autocommit = False


#: A table of the test's own (WAL-logged, unlike a temporary one), dropped again.
_LOGGED = "group_commit_probe"


@POSTGRES_ONLY
def test_the_flush_transaction_flushes_the_wal_past_an_asynchronous_commit(database_url: str) -> None:
    """What the gated unit's round trip runs after its asynchronous ``COMMIT``: once it returns, the WAL is flushed
    at least as far as it had been written when it began, so past that commit (a transaction writing no WAL record,
    such as ``SELECT pg_current_xact_id()`` alone, would not flush: PostgreSQL flushes at commit only a transaction
    that wrote WAL)."""
    assert _inserted_then_flushed(database_url, group_commit.POSTGRES_FLUSH)


@POSTGRES_ONLY
def test_a_gated_postgres_unit_commits_before_its_flush_and_returns_flushed(
    make_plane: Any, database_url: str, statements: list[str]
) -> None:
    """An enqueue (the admission gate, shared), an admission (exclusive) and a completion that frees a seat (the
    gate at its commit) each end their round trip with the asynchronous ``COMMIT`` then the flushing transaction;
    when they return the WAL is flushed as far as it was written (with the asynchronous commit alone it is not,
    until the WAL writer's next round, 200 ms by default)."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "request-1")
    lease = plane.admit_request("request-1", 1_050, plane.owner_identity.owner_instance_id)
    assert lease is not None
    activate(plane, lease, 1_100)
    plane.complete_live_turn(lease, 1_300, LiveTurnCompletion("completed"))
    ends = [sql for sql in statements if "COMMIT" in sql]
    flushed = [sql for sql in ends if sql.endswith(group_commit.POSTGRES_FLUSH)]
    assert len(flushed) >= 3, ends  # the enqueue's, the admission's and the completion's
    for sql in flushed:
        before, after = sql.split(group_commit.POSTGRES_ASYNC, 1)
        assert not re.search(r"\bCOMMIT\b", before), "the unit's statements come before its commit"
        assert after.index("; COMMIT") < after.index(group_commit.POSTGRES_FLUSH), "commit, then flush"


@POSTGRES_ONLY
def test_a_lease_unit_that_changes_no_count_commits_synchronously(
    make_plane: Any, database_url: str, statements: list[str]
) -> None:
    """A start without a start interval and a dispatch intent change nothing admission counts: they commit
    without the admission gate, nothing waits behind their flush, so they commit as before, synchronously, without
    the extra transaction."""
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "request-1")
    lease = plane.admit_request("request-1", 1_050, plane.owner_identity.owner_instance_id)
    assert lease is not None
    statements.clear()
    plane.mark_starting(lease, 1_100)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    ends = [sql for sql in statements if re.search(r"\bCOMMIT$", sql)]
    assert len(ends) == 2, statements
    assert not [sql for sql in ends if group_commit.POSTGRES_FLUSH in sql or group_commit.POSTGRES_ASYNC in sql]


@POSTGRES_ONLY
def test_without_the_flush_function_gated_units_commit_under_their_gate(
    make_plane: Any, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that may not run ``pg_logical_emit_message`` (simulated: the check at connect answers no, a
    revoked privilege on the shared test server being what cannot be set up here) commits every unit synchronously,
    and the plane works as before."""
    monkeypatch.setattr(group_commit, "postgres_flush_allowed", lambda _connection: False)
    plane = make_plane(policy=ROOMY)
    enqueue(plane, "request-1")
    lease = plane.admit_request("request-1", 1_050, plane.owner_identity.owner_instance_id)
    assert lease is not None
    assert not [sql for sql in statements if group_commit.POSTGRES_FLUSH in sql]
    stored = plane.get_request("request-1")
    assert stored is not None
    assert stored.state == "admitted"


@POSTGRES_ONLY
def test_the_flush_function_is_allowed_on_the_test_server(database_url: str) -> None:
    """The connect-time check answers yes where ``pg_logical_emit_message`` is executable (PUBLIC by default)."""
    raw = pg_engine(database_url).raw_connection()
    try:
        raw.dbapi_connection.autocommit = True
        assert group_commit.postgres_flush_allowed(raw.dbapi_connection) is True
    finally:
        raw.close()


@SQLITE_ONLY
def test_the_flushed_file_is_the_one_sqlite_opened(
    make_plane: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``-wal`` path a unit flushes is asked of SQLite when the connection opens (``PRAGMA database_list``): an
    absolute path even when the URL's is relative, so a later change of the working directory cannot make the
    flush miss the file (a missing file counts as checkpointed, and would flush nothing)."""
    folder = Path(database_url).parent
    monkeypatch.chdir(folder)
    plane = make_plane(database=f"sqlite:///{Path(database_url).name}")
    raw = plane.engine.raw_connection()
    try:
        wal = raw.info[group_commit.WAL_INFO]
        assert os.path.isabs(wal)
        assert os.path.realpath(wal) == os.path.realpath(folder / f"{Path(database_url).name}-wal")
    finally:
        raw.close()
