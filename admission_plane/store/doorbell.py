"""Wake-ups for connectors waiting for admission.

Waiting connectors used to re-run the admission look every few milliseconds. A look
is a read transaction of about ten statements, and on a busy file every look starts
with a cold page cache (SQLite drops a connection's cache whenever another connection
has committed), so forty waiters cost a CPU core between them while they all learned
the same thing: nothing changed.

Instead, every writer of this library that changes what admission could decide rings
a *doorbell*: three 64-bit counters at the start of the writer-gate file
(``<database>-writer.lock``), incremented while the writer still holds the gate, right
after its commit. A waiter reads them with one ``pread`` (a few microseconds, no SQL)
and runs the look again only when a counter it cares about has moved:

* ``queue`` — a request left the queue (admitted, cancelled, timed out, settled);
* ``seats`` — a seat was freed (a lease was deleted);
* ``starts`` — a lease left the start window (``admitted``/``starting``/``dispatch_intent``).

On Linux a waiter does not even read them on a timer: it sleeps on an inotify watch of the gate file
(:class:`FileWatch`, one per plane, shared by its waiting threads: :meth:`Doorbell.await_ring`), which
every ring (a ``pwrite`` of the counters) wakes, from any process, and reads them only then. Reading
every few milliseconds cost a waiter far back in the queue up to its back-off (4 ms by default) to learn
that the last request ahead of it had left; the queue then advanced one back-off at a time, and with 8
connectors on 4 seats admission, not the disk, set the pace. Every ring wakes every watching plane, so a
waiter two or more departures from its turn naps between reads instead (``service._waiting._nap``). Where
there is no watch (another system, the user's inotify instances used up), the waiter reads them every step.

Changes that may reorder the whole queue (a cooldown set, a durable policy claimed, a
drain begun or completed) add ``2**32`` to all three, which wakes every waiter.

On PostgreSQL the same counters live in memory, in each plane: a writing transaction
that changed something sends ``NOTIFY admission_plane_doorbell, 'q,s,t'`` (delivered
only if it commits, to every listener of the database, on every host), and a daemon
thread of the waiting plane, on its own connection, listens and counts
(:class:`ListeningDoorbell`). It listens only while someone in the plane waits (and
for :data:`ListeningDoorbell.LINGER_S` after): every notification wakes every listening
backend and listening thread, so a plane whose turns are admitted at once must not pay
for everybody else's commits. Until it listens, and while it reconnects, ``read``
returns ``None`` and waiters poll; each ``LISTEN`` counts as a change for everyone.

Who is told (PostgreSQL): a ``NOTIFY`` costs every commit that sends one more than the statement
(the server queues notifications one committing transaction at a time, holding a database-wide
lock through the commit's WAL flush, so ringing commits do not share flushes), and most planes
have nobody waiting. A writer therefore sends it only while some connection listens, which it
learns without a round trip of its own: every listening connection holds the advisory lock
:data:`~.advisory.LISTENING_KEY` shared, at session level (released by ``UNLISTEN`` or by the
end of its session, so a listener that crashed leaves nothing behind), and a writer's commit
round trip tries that lock exclusively for an instant (:data:`SOMEONE_LISTENS`): taken, nobody
listens, and it is released at once; refused, someone listens (or another writer was trying it
at the same instant: a spurious ring, which costs a look). Why no ring is lost: the writer tries
the lock while it holds the admission gate (every writer that rings holds it through its commit,
shared or exclusively; one that does not, a count-neutral lease unit, always sends), and a
listener, after ``LISTEN`` and taking its lock, takes the admission gate exclusively for an
instant before it counts the ``LISTEN`` as a change for everyone (:data:`REGISTER`). A writer
that tried the lock after the listener took it sends, after the ``LISTEN``; one that tried it
before still held the gate then, so it committed before the listener's barrier passed, and the
waiters' next look sees what it did. Other programs (or another version of this library) that
listen without the lock hear only the writers that found a listener; their waiters' fallback
timer covers the rest, as for writers that do not ring.

The doorbell only decides *when* to look; every decision is still made by the
admission transaction itself, so a missed or spurious ring costs latency, never
correctness. Writers that do not ring (the original JavaScript connector, the
``sqlite3`` shell, another library version) are covered by the waiter's fallback timer.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import logging
import math
import os
import select
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from sqlalchemy import Engine

from ..errors import AdmissionDatabaseError
from .advisory import ADVISORY_LOCK_KEY, LISTENING_KEY
from .engine import writer_lock_path

_log = logging.getLogger(__name__)
#: The PostgreSQL notification channel (one per database).
CHANNEL = "admission_plane_doorbell"

#: SQL condition, true when a writer's ``NOTIFY`` has someone to reach ("Who is told" above): the
#: listeners' lock cannot be taken exclusively for an instant. Evaluated under the admission gate.
SOMEONE_LISTENS = (
    f"CASE WHEN pg_try_advisory_lock({LISTENING_KEY}) THEN NOT pg_advisory_unlock({LISTENING_KEY}) ELSE true END"
)
#: What a unit runs after its commit round trip failed once it had asked :data:`SOMEONE_LISTENS`: a statement
#: cancelled between taking the listeners' lock and releasing it would leave the session holding it (a
#: session-level lock outlives the rollback) and keep every listener from registering until it ended.
RELEASE_ASKED = (
    f"SELECT pg_advisory_unlock({LISTENING_KEY}) FROM pg_locks WHERE locktype = 'advisory'"
    f" AND pid = pg_backend_pid() AND granted AND mode = 'ExclusiveLock' AND classid = {LISTENING_KEY >> 32}"
    f" AND objid = {LISTENING_KEY & 0xFFFFFFFF} AND objsubid = 1"
)
#: How long a listener waits to take its lock and pass the admission gate before it gives up, reconnects
#: and tries again (its waiters poll meanwhile): a writer's session left holding the listeners' lock (its
#: statement cancelled between taking and releasing it) would otherwise hold every listener back until it ended.
REGISTER_TIMEOUT_MS = 5_000
#: What a listening connection runs after ``LISTEN``, in one round trip: take the listeners' lock (shared, at
#: session level: it outlives the transaction), then the admission gate exclusively for an instant (the
#: barrier: every writer that tried the listeners' lock before has committed once it passes).
REGISTER = (
    f"BEGIN; SET LOCAL lock_timeout = {REGISTER_TIMEOUT_MS}; SELECT pg_advisory_lock_shared({LISTENING_KEY}); "
    f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY}); COMMIT"
)
#: What a listening connection runs when nobody waits any more.
UNREGISTER = f"SELECT pg_advisory_unlock_shared({LISTENING_KEY}); UNLISTEN {CHANNEL}"

_COUNTERS = struct.Struct("<3Q")
_MASK = (1 << 64) - 1
#: What ``Bell.EVERYONE`` adds to each counter: more than any waiter's position.
EVERYONE_STEP = 1 << 32


class Bell(enum.IntFlag):
    """What a committed transaction changed, as far as waiting connectors are concerned."""

    QUEUE = 1
    SEATS = 2
    STARTS = 4
    EVERYONE = 8


_QUEUE, _SEATS, _STARTS, _EVERYONE = int(Bell.QUEUE), int(Bell.SEATS), int(Bell.STARTS), int(Bell.EVERYONE)


@attrs.frozen
class Chimes:
    """The three counters as one waiter read them, or what one transaction adds to them."""

    queue: int = 0
    seats: int = 0
    starts: int = 0

    @classmethod
    def of(cls, bells: int) -> Chimes:
        """What ringing ``bells`` once adds: one per bell, ``EVERYONE_STEP`` to each for ``EVERYONE``."""
        bells = int(bells)  # plain integer tests: every committing transaction comes through here
        step = EVERYONE_STEP if bells & _EVERYONE else 0
        return cls(
            step + (1 if bells & _QUEUE else 0),
            step + (1 if bells & _SEATS else 0),
            step + (1 if bells & _STARTS else 0),
        )

    def plus(self, other: Chimes) -> Chimes:
        """Counter by counter, modulo 2**64."""
        return Chimes(
            (self.queue + other.queue) & _MASK, (self.seats + other.seats) & _MASK, (self.starts + other.starts) & _MASK
        )

    def since(self, earlier: Chimes) -> Chimes:
        """How far each counter moved from ``earlier`` to here, modulo 2**64."""
        return Chimes(
            (self.queue - earlier.queue) & _MASK,
            (self.seats - earlier.seats) & _MASK,
            (self.starts - earlier.starts) & _MASK,
        )

    def __bool__(self) -> bool:
        return bool(self.queue or self.seats or self.starts)

    def payload(self) -> str:
        """The text of a PostgreSQL notification carrying this delta."""
        return f"{self.queue},{self.seats},{self.starts}"

    @classmethod
    def from_payload(cls, text: str) -> Chimes:
        """Parse :meth:`payload`; anything else counts as a change for everyone."""
        try:
            queue, seats, starts = (int(part) for part in text.split(","))
        except ValueError:
            return cls.of(Bell.EVERYONE)
        return cls(queue & _MASK, seats & _MASK, starts & _MASK)


def _unpack(data: bytes) -> Chimes:
    return Chimes(*_COUNTERS.unpack(data.ljust(_COUNTERS.size, b"\0")[: _COUNTERS.size]))


def ring(fd: int, delta: Chimes) -> None:
    """Add ``delta`` to the counters in the gate file ``fd``; the caller holds the gate's lock.

    A failure is swallowed: the transaction has committed already, and waiters fall back to
    their timer.
    """
    if not delta:
        return
    try:
        after = _unpack(os.pread(fd, _COUNTERS.size, 0)).plus(delta)
        os.pwrite(fd, _COUNTERS.pack(after.queue, after.seats, after.starts), 0)
    except OSError:
        pass


#: Errors of ``open`` meaning "something other than a regular file is at the path".
_NOT_A_FILE = frozenset({errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV})


def open_gate_file(path: str) -> int | None:
    """Open the writer-gate file ``path`` for reading and writing (created with mode 0600 if missing).

    Never through a symbolic link (``O_NOFOLLOW``) and never anything but a regular file
    (``fstat``): a link, FIFO, directory or device there raises
    :class:`~admission_plane.errors.AdmissionDatabaseError`, since the file's first bytes
    are rewritten. ``None`` when it cannot be opened otherwise (an unwritable directory):
    callers then do without it.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno in _NOT_A_FILE:
            raise _not_a_file(path) from None
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _not_a_file(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_a_file(path: str) -> AdmissionDatabaseError:
    return AdmissionDatabaseError(f"writer lock file {path} is not a regular file (refusing to use it)")


#: inotify (Linux): the flags of ``inotify_init1`` and the event a waiter's watch asks for (a write to the file).
_IN_NONBLOCK, _IN_CLOEXEC, _IN_MODIFY = os.O_NONBLOCK, os.O_CLOEXEC, 0x00000002


def _inotify() -> Any:
    """The C library's inotify functions (``inotify_init1`` is an attribute), or ``None`` where there are none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _inotify()


class FileWatch:
    """Linux: what lets a SQLite waiter sleep until the doorbell is rung instead of reading it every few
    milliseconds. An inotify instance watching the gate file for writes (``IN_MODIFY``): a ring is a ``pwrite``
    of the counters, so every ring after :meth:`Doorbell.watch` returned wakes :meth:`wait`, from any process.
    A waiter reads the counters *after* the watch is in place and before each wait, so no ring is missed
    between the read and the wait. Every ring wakes every watching plane (each waiter then reads 24 bytes and
    goes back to sleep unless what it waits for moved): a few microseconds per ring and waiter, against a read
    every ``initial_delay_ms`` while polling, and a freed seat is seen at once.
    """

    __slots__ = ("_fd", "_poll")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> bool:
        """Block until the file was written since the last :meth:`wait` (or since the watch began), or for
        ``timeout_s``; whether it was written."""
        if not self._poll.poll(max(0, math.ceil(timeout_s * 1000))):
            return False
        self.drain()
        return True

    def fileno(self) -> int:
        """The inotify descriptor, readable once the file was written (for an event loop's ``add_reader``)."""
        return self._fd

    def drain(self) -> None:
        """Consume the pending events (what matters is that there were some; any left make it readable again)."""
        with contextlib.suppress(OSError):  # none pending, or closed meanwhile (the waiter then reads ``None``)
            os.read(self._fd, 4096)

    def close(self) -> None:
        """Release the inotify instance (idempotent)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class Doorbell:
    """A waiter's read handle on one database's doorbell (the writer-gate file at ``path``).

    Open it with :meth:`open`, which returns ``None`` where the file cannot be opened
    (callers then poll without one). Safe to share between threads.

    Threads that wait on it share one :class:`FileWatch` (:meth:`rings_heard`, :meth:`await_ring`), made at
    the first wait and kept until :meth:`close`: a plane holds one inotify instance however many of its
    threads wait (the user's instances are few, ``fs.inotify.max_user_instances``, and shared with every
    other program of the user). One waiting thread at a time polls it; the others sleep on a condition that
    it notifies at each ring.
    """

    __slots__ = ("_fd", "_heard", "_leading", "_ring_lock", "_rung", "_shared", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._ring_lock = threading.Lock()
        #: Notified when the thread polling the shared watch returns (a ring heard, or its time is up).
        self._rung = threading.Condition(self._ring_lock)
        self._shared: FileWatch | None = None
        #: How many times the shared watch woke for a ring.
        self._heard = 0
        #: Whether a thread is polling the shared watch.
        self._leading = False

    @classmethod
    def open(cls, path: str | None) -> Doorbell | None:
        """The doorbell of the gate file ``path`` (created if missing), or ``None``; see :func:`open_gate_file`."""
        fd = None if path is None else open_gate_file(path)
        return None if path is None or fd is None else cls(path, fd)

    def read(self) -> Chimes | None:
        """The counters now, or ``None`` if they cannot be read (or the doorbell is closed)."""
        try:
            return _unpack(os.pread(self._fd, _COUNTERS.size, 0))
        except OSError:
            return None

    def watch(self) -> FileWatch | None:
        """A :class:`FileWatch` on this doorbell's file, or ``None`` where there is none to be had (not Linux,
        the user's inotify instances used up, the doorbell closed): the waiter then polls :meth:`read`."""
        fd = self._fd
        if _LIBC is None or fd < 0:
            return None
        watch_fd = int(_LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        if watch_fd < 0:
            return None  # EMFILE: fs.inotify.max_user_instances reached
        # The open file itself (its /proc link resolves to the inode, wherever the path now leads).
        if _LIBC.inotify_add_watch(watch_fd, f"/proc/self/fd/{fd}".encode(), _IN_MODIFY) < 0:
            os.close(watch_fd)
            return None
        return FileWatch(watch_fd)

    def rings_heard(self) -> int | None:
        """How many rings the shared watch has heard so far, or ``None`` where there is no watch to be had (see
        :meth:`watch`; tried again at the next call). Take it *before* reading the counters, and pass it to
        :meth:`await_ring`: a ring after it is then never slept through."""
        with self._ring_lock:
            if self._shared is None:
                self._shared = self.watch()
            return None if self._shared is None else self._heard

    def await_ring(self, heard: int, timeout_s: float) -> int:
        """Sleep until the shared watch has heard a ring since ``heard`` (what :meth:`rings_heard` or the last
        call returned) or for ``timeout_s``; the rings heard now. Returns at once without a watch (closed)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._rung:
            while self._heard == heard:
                watch, remaining = self._shared, deadline - time.monotonic()
                if watch is None or remaining <= 0:
                    break
                if self._leading:
                    self._rung.wait(remaining)
                    continue
                self._leading = True
                self._ring_lock.release()
                woke = False
                try:
                    woke = watch.wait(remaining)
                finally:
                    self._ring_lock.acquire()
                    self._leading = False
                    if woke:
                        self._heard += 1
                    if self._shared is not watch:
                        watch.close()  # the doorbell was closed while this thread polled it
                    self._rung.notify_all()
            return self._heard

    def close(self) -> None:
        """Close the file and the shared watch (idempotent); :meth:`read` then returns ``None``."""
        with self._ring_lock:
            watch, self._shared = self._shared, None
            if watch is not None and not self._leading:
                watch.close()  # else the thread polling it closes it when its poll returns
            self._rung.notify_all()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class ListeningDoorbell:
    """PostgreSQL: counters kept in memory by a thread that listens on :data:`CHANNEL`.

    It listens on demand: a waiter holds :meth:`interest` while it waits, and the thread,
    started by the first interest, runs ``LISTEN`` (and :data:`REGISTER`) on its own connection
    while any interest is held and ``UNLISTEN`` (:data:`UNREGISTER`) once none has been for
    :data:`LINGER_S` (the connection stays open for the next waiter). :meth:`read` returns
    ``None`` while it does not listen, and whenever the connection was lost (the thread then
    reconnects every second); each ``LISTEN`` counts as a change for everyone, since anything
    may have rung meanwhile (or not been sent: nobody listened).
    """

    __slots__ = (
        "_changed",
        "_chimes",
        "_connect",
        "_interest",
        "_listeners",
        "_lock",
        "_ready",
        "_stop",
        "_thread",
        "_waiting",
        "_wanted",
    )

    #: How long one wait for notifications lasts before the thread checks for ``close`` and interest.
    POLL_S = 0.2
    #: How long the thread keeps listening after the last interest was released (s): waiters that
    #: come and go in quick succession share one ``LISTEN``.
    LINGER_S = 1.0

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        #: Notified whenever the counters move, so a waiter wakes at the ring, not at its next poll.
        self._changed = threading.Condition(self._lock)
        self._chimes = Chimes()
        self._ready = threading.Event()
        self._stop = threading.Event()
        #: Set while any interest is held: wakes the idle thread to ``LISTEN``.
        self._wanted = threading.Event()
        self._interest = 0
        self._thread: threading.Thread | None = None
        self._listeners: tuple[Callable[[], object], ...] = ()
        #: The waiters blocked in :meth:`wait_until`: each one's flag and the condition that sets it.
        self._waiting: dict[threading.Event, Callable[[Chimes], bool]] = {}

    @classmethod
    def for_engine(cls, engine: Engine) -> ListeningDoorbell:
        """A doorbell listening through a dedicated connection of ``engine``: taken from its pool
        (so it is made with the engine's own connect arguments and hooks) and detached from it."""

        def connect() -> Any:
            pooled = engine.raw_connection()
            pooled.detach()
            connection = pooled.dbapi_connection
            if connection is None:  # only an invalidated pooled connection has none; _listen retries
                raise ConnectionError("the pool gave out an invalidated connection")
            connection.rollback()  # leave any transaction the pool's ping may have opened
            connection.autocommit = True
            return connection

        return cls(connect)

    def interest(self) -> Callable[[], None]:
        """Listen until the returned function is called (idempotent): a waiter holds this while it waits."""
        with self._lock:
            self._interest += 1
            self._wanted.set()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._listen, name="admission-plane-doorbell", daemon=True)
                self._thread.start()
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._interest -= 1
                if self._interest == 0:
                    self._wanted.clear()

        return release

    def read(self) -> Chimes | None:
        """The counters now, or ``None`` while the listener is not listening."""
        if not self._ready.is_set():
            return None
        with self._lock:
            return self._chimes

    def wait_ready(self, timeout: float) -> Chimes | None:
        """Wait up to ``timeout`` seconds for the ``LISTEN`` (under an :meth:`interest`); then :meth:`read`."""
        self._ready.wait(timeout)
        return self.read()

    def wait_past(self, seen: Chimes, timeout: float) -> Chimes | None:
        """Block until the counters move past ``seen`` (or ``timeout`` seconds pass); then
        :meth:`read`. A waiter on PostgreSQL wakes within the notification's delivery, not at
        its next poll."""
        with self._changed:
            if self._ready.is_set() and self._chimes == seen:
                self._changed.wait(timeout)
            return self._chimes if self._ready.is_set() else None

    def wait_until(self, wanted: Callable[[Chimes], bool], timeout: float) -> Chimes | None:
        """Block until ``wanted(counters)`` holds, ``timeout`` seconds pass, or the doorbell stops listening;
        then :meth:`read` (``None``: not listening).

        The listening thread evaluates ``wanted`` at each counted change and wakes only the waiters whose
        condition now holds, so a waiter sleeps through the rings that do not concern it (with
        :meth:`wait_past` every ring wakes every waiting thread of the plane, each to find out for itself).
        ``wanted`` runs on the listening thread, under the doorbell's lock: it must be quick, must not block
        and must not call the doorbell; if it raises, its waiter is woken to find out for itself.
        """
        flag = threading.Event()
        with self._lock:
            if not self._ready.is_set():
                return None
            if _holds(wanted, self._chimes):
                return self._chimes
            self._waiting[flag] = wanted
        try:
            flag.wait(timeout)
        finally:
            with self._lock:
                del self._waiting[flag]
        return self.read()

    def subscribe(self, listener: Callable[[], object]) -> Callable[[], None]:
        """Call ``listener()`` on the listening thread after every counted change; returns the
        unsubscribe function. The asyncio API hands rings to its event loop this way."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(known for known in self._listeners if known is not listener)

        return unsubscribe

    def _count(self, delta: Chimes) -> None:
        with self._lock:
            self._chimes = chimes = self._chimes.plus(delta)
            self._changed.notify_all()
            for flag, wanted in self._waiting.items():
                if not flag.is_set() and _holds(wanted, chimes):
                    flag.set()
            listeners = self._listeners
        for listener in listeners:
            try:
                listener()
            except Exception as error:  # noqa: BLE001 - a closed loop must not stop the counting
                _log.debug("admission doorbell listener failed: %s", type(error).__name__)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                connection = self._connect()
            except Exception as error:  # noqa: BLE001 - any failure means "no doorbell for now"
                _log.debug("admission doorbell cannot connect: %s", type(error).__name__)
                self._stop.wait(1.0)
                continue
            try:
                while not self._stop.is_set():
                    if not self._wanted.wait(self.POLL_S):
                        continue  # nobody waits: stay connected, do not listen
                    self._serve(connection)
            except Exception as error:  # noqa: BLE001 - lost connection: poll until it is back
                _log.debug("admission doorbell lost its connection: %s", type(error).__name__)
            finally:
                self._stop_listening()
                with contextlib.suppress(Exception):
                    connection.close()
            self._stop.wait(1.0)

    def _serve(self, connection: Any) -> None:
        """``LISTEN``, and count notifications until no interest was held for :data:`LINGER_S`; then ``UNLISTEN``."""
        connection.execute(f"LISTEN {CHANNEL}")
        connection.execute(REGISTER, prepare=False)  # several statements: the simple query protocol
        self._count(Chimes.of(Bell.EVERYONE))  # anything may have rung (or not: nobody listened) until now
        self._ready.set()
        idle_since: float | None = None
        while not self._stop.is_set():
            for note in connection.notifies(timeout=self.POLL_S):
                self._count(Chimes.from_payload(note.payload))
            with self._lock:  # decided under the lock: an interest taken now finds the doorbell not ready
                if self._interest:
                    idle_since = None
                    continue
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if now - idle_since < self.LINGER_S:
                    continue
                self._ready.clear()
                self._wake_all()
            connection.execute(UNREGISTER, prepare=False)
            return

    def _stop_listening(self) -> None:
        """Not listening any more (the connection was lost, or the doorbell closes): every waiter finds out now."""
        with self._lock:
            self._ready.clear()
            self._wake_all()

    def _wake_all(self) -> None:
        """Under the lock: wake every :meth:`wait_until` waiter."""
        for flag in self._waiting:
            flag.set()

    def close(self) -> None:
        """Stop the listener thread and close its connection (idempotent)."""
        self._stop.set()
        self._stop_listening()
        self._wanted.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self.POLL_S + 1.0)


def _holds(wanted: Callable[[Chimes], bool], chimes: Chimes) -> bool:
    """``wanted(chimes)``, or ``True`` if it raised: its waiter then wakes and finds out for itself."""
    try:
        return bool(wanted(chimes))
    except Exception as error:  # noqa: BLE001 - a waiter's condition must not stop the counting
        _log.debug("admission doorbell wait condition failed: %s", type(error).__name__)
        return True


def open_doorbell(engine: Engine) -> Doorbell | ListeningDoorbell | None:
    """The doorbell of ``engine``'s database: the gate file on SQLite, notifications on PostgreSQL."""
    if engine.dialect.name == "postgresql":
        return ListeningDoorbell.for_engine(engine)
    return Doorbell.open(writer_lock_path(engine))
