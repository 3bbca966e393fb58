"""PostgreSQL: a writer sends its doorbell ``NOTIFY`` only while some plane listens, and no ring is lost for it.

The doorbell's "Who is told" (:mod:`admission_plane.store.doorbell`): every listening connection holds the
listeners' advisory lock shared, and a writer's commit tries that lock under the admission gate. An
*eavesdropper* here is a plain connection that runs ``LISTEN`` without taking the lock (what another program
would do): it hears exactly the notifications the writers sent. Real planes, a real server, and for the
crashed listener a real process killed with ``SIGKILL``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbutil import libpq_url
from planes import CONTENT_KEY, ENCRYPTION_KEY, activate, admit, enqueue

from admission_plane import AdmissionError, AdmissionPlane, LiveTurnCompletion, Policy
from admission_plane.migrate import upgrade
from admission_plane.store.advisory import ADVISORY_LOCK_KEY, LISTENING_KEY
from admission_plane.store.doorbell import CHANNEL, Chimes, ListeningDoorbell

pytestmark = pytest.mark.postgres

TWO_SEATS = Policy(2, 2, 0, 1_800_000, 30_000)
KEYS: dict[str, Any] = {"encryption_key": ENCRYPTION_KEY, "content_fingerprint_key": CONTENT_KEY}
#: How long an eavesdropper waits for a notification that should not come.
QUIET_S = 0.5


@pytest.fixture
def migrated(postgres_url: str) -> str:
    upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def eavesdropper(migrated: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening on the doorbell's channel without registering as a listener."""
    with psycopg.connect(libpq_url(migrated), autocommit=True) as connection:
        connection.execute(f"LISTEN {CHANNEL}")
        yield connection


@pytest.fixture
def writer(migrated: str) -> Iterator[AdmissionPlane]:
    plane = AdmissionPlane(migrated, policy=TWO_SEATS, **KEYS)
    try:
        yield plane
    finally:
        plane.close()


def heard(connection: psycopg.Connection[Any], timeout: float = QUIET_S) -> list[str]:
    """The payloads of the notifications that arrive within ``timeout`` seconds."""
    return [note.payload for note in connection.notifies(timeout=timeout)]


def listen(plane: AdmissionPlane) -> ListeningDoorbell:
    """Hold an interest in ``plane``'s doorbell for the rest of the test and wait until it listens."""
    doorbell = plane._ctx.doorbell
    assert isinstance(doorbell, ListeningDoorbell)
    doorbell.interest()
    assert doorbell.wait_ready(10) is not None, "the doorbell never started listening"
    return doorbell


def full_turn(plane: AdmissionPlane, request_id: str, now: int) -> None:
    """A turn that rings at its admission (a request left the queue), its activation and its completion."""
    enqueue(plane, request_id, agent_id=f"agent-{request_id}", now=now)
    lease = admit(plane, now + 1)
    activate(plane, lease, now + 2)
    plane.complete_live_turn(lease, now + 10, LiveTurnCompletion("completed"))


def test_nobody_listening_no_commit_notifies_and_none_leaves_the_listeners_lock_taken(
    writer: AdmissionPlane, eavesdropper: psycopg.Connection[Any], migrated: str
) -> None:
    """A whole turn (an admission under the admission gate, lease units that take it at commit, an exclusive
    cancel) with no plane listening sends nothing; and the instant try of the listeners' lock by each of those
    commits was released: another session takes the lock exclusively at once."""
    full_turn(writer, "r1", 1_000)
    enqueue(writer, "r2", agent_id="agent-r2", now=1_100)
    writer.cancel_queued("r2", 1_101)
    assert heard(eavesdropper) == []
    with psycopg.connect(libpq_url(migrated), autocommit=True) as other:
        assert lock_is_free(other)


def test_while_a_plane_listens_every_ringing_commit_notifies_and_the_listener_counts_it(
    writer: AdmissionPlane, eavesdropper: psycopg.Connection[Any], migrated: str
) -> None:
    """With another plane's doorbell listening, the same turn's ringing commits all send: the eavesdropper hears
    them, and the listening plane's counters move by exactly what they carried."""
    waiter = AdmissionPlane(migrated, policy=TWO_SEATS, **KEYS)
    try:
        doorbell = listen(waiter)
        before = doorbell.read()
        assert before is not None
        full_turn(writer, "r1", 1_000)
        # The admission (a request left the queue), the activation (a start slot), the completion (a seat, a slot).
        assert heard(eavesdropper) == ["1,0,0", "0,0,1", "0,1,1"]
        expected = Chimes(1, 1, 2)
        counted = doorbell.wait_until(lambda current: current.since(before) == expected, 5)
        assert counted is not None
        assert counted.since(before) == expected
    finally:
        waiter.close()


def test_a_listener_counts_its_listen_only_once_every_writer_holding_the_admission_gate_has_committed(
    migrated: str,
) -> None:
    """The barrier: while a transaction holds the admission gate (as a lease unit does through its commit, from
    the instant it tried the listeners' lock), a plane that starts listening has taken the listeners' lock but
    does not call itself ready; the moment that transaction commits, it does. Without the barrier a writer that
    found nobody listening could commit after the waiter's next look, and its ring would be lost."""
    waiter = AdmissionPlane(migrated, policy=TWO_SEATS, **KEYS)
    try:
        with psycopg.connect(libpq_url(migrated)) as holder:  # a transaction open until the block ends
            holder.execute("SELECT pg_advisory_xact_lock_shared(%s)", [ADVISORY_LOCK_KEY])
            doorbell = waiter._ctx.doorbell
            assert isinstance(doorbell, ListeningDoorbell)
            doorbell.interest()
            with psycopg.connect(libpq_url(migrated), autocommit=True) as other:  # writers from now on send
                wait_for(lambda: not lock_is_free(other), "the listener never took the listeners' lock")
            assert doorbell.wait_ready(QUIET_S) is None, "ready while a writer that may not have sent was in flight"
            holder.commit()
        assert doorbell.wait_ready(10) is not None, "not ready after the writer committed"
    finally:
        waiter.close()


CRASHING_LISTENER = """
import sys, time
from admission_plane import AdmissionPlane, Policy
plane = AdmissionPlane(sys.argv[1], policy=Policy(2, 2, 0, 1_800_000, 30_000),
                       encryption_key=bytes([1]) * 32, content_fingerprint_key=bytes([2]) * 32)
doorbell = plane._ctx.doorbell
print("opened", flush=True)
sys.stdin.readline()
doorbell.interest()
if sys.argv[2] == "listening":
    assert doorbell.wait_ready(10) is not None
print(sys.argv[2], flush=True)
time.sleep(600)
"""


def lock_is_free(connection: psycopg.Connection[Any]) -> bool:
    """Whether the listeners' lock can be taken exclusively now (taken and given back at once)."""
    if connection.execute("SELECT pg_try_advisory_lock(%s)", [LISTENING_KEY]).fetchone() != (True,):
        return False
    connection.execute("SELECT pg_advisory_unlock(%s)", [LISTENING_KEY])
    return True


def wait_for(condition: Any, what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.025)


@pytest.mark.parametrize("step", ["at the barrier", "listening"])
def test_a_listener_killed_at_any_step_leaves_no_registration_behind(
    writer: AdmissionPlane, eavesdropper: psycopg.Connection[Any], migrated: str, step: str
) -> None:
    """A process whose plane registers as a listener is killed with ``SIGKILL``: once it has taken the listeners'
    lock and waits at the barrier (the admission gate held by a transaction of the test), or once it listens
    (commits then send). After the server has ended its session the lock is free again, and commits send
    nothing: its registration was the session's own lock, gone with it."""
    root = Path(__file__).resolve().parents[3]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    dsn = libpq_url(migrated)
    with psycopg.connect(dsn) as gate_holder, psycopg.connect(dsn, autocommit=True) as other:
        process = subprocess.Popen(
            [sys.executable, "-c", CRASHING_LISTENER, migrated, step],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        try:
            assert process.stdout is not None
            assert process.stdin is not None
            assert process.stdout.readline().strip() == "opened"
            if step == "at the barrier":  # held from before the listener starts, so it stops at the barrier
                gate_holder.execute("SELECT pg_advisory_xact_lock_shared(%s)", [ADVISORY_LOCK_KEY])
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == step
            if step == "listening":
                full_turn(writer, "r1", 1_000)
                assert heard(eavesdropper), "nothing was sent while the other process listened"
            else:
                wait_for(lambda: not lock_is_free(other), "the listener never took the listeners' lock")
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
        gate_holder.rollback()
        # The server notices the closed socket and ends the session.
        wait_for(lambda: lock_is_free(other), "the killed listener's session still holds the listeners' lock")
    full_turn(writer, "r2", 2_000)
    assert heard(eavesdropper) == []


def test_a_commit_that_fails_after_taking_the_listeners_lock_gives_it_back(
    writer: AdmissionPlane, migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session-level lock outlives a rollback: were a commit's statement to fail between taking the listeners'
    lock and releasing it (a cancel at that instant; here a division by zero placed there), the pooled
    connection would keep it, and no listener could register while it lived. The unit's rollback gives it
    back: the admission fails, nothing is admitted, and another session takes the lock at once."""
    from admission_plane.store import unit_of_work

    # Volatile, so not folded away at planning: the division fails after the lock was taken.
    failing = f"CASE WHEN pg_try_advisory_lock({LISTENING_KEY}) THEN 1 / (0 * random())::int = 1 ELSE true END"
    monkeypatch.setattr(unit_of_work, "SOMEONE_LISTENS", failing)
    enqueue(writer, "r1", agent_id="agent-r1", now=1_000)
    with pytest.raises(AdmissionError):
        writer.admit_next(1_001, writer.owner_identity.owner_instance_id)
    with psycopg.connect(libpq_url(migrated), autocommit=True) as other:
        assert lock_is_free(other)
    monkeypatch.undo()
    assert admit(writer, 1_002).request_id == "r1"  # the failed admission changed nothing
