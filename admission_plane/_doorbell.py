"""Wake-ups for connectors waiting for admission on one SQLite database file.

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

Changes that may reorder the whole queue (a cooldown set, a durable policy claimed, a
drain begun or completed) add ``2**32`` to all three, which wakes every waiter.

The doorbell only decides *when* to look; every decision is still made by the
admission transaction itself, so a missed or spurious ring costs latency, never
correctness. Writers that do not ring (the original JavaScript connector, the
``sqlite3`` shell, another library version) are covered by the waiter's fallback timer.
"""

from __future__ import annotations

import enum
import os
import struct

import attrs

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


@attrs.frozen
class Chimes:
    """The three counters as one waiter read them."""

    queue: int = 0
    seats: int = 0
    starts: int = 0


def _unpack(data: bytes) -> Chimes:
    return Chimes(*_COUNTERS.unpack(data.ljust(_COUNTERS.size, b"\0")[: _COUNTERS.size]))


def ring(fd: int, bells: int) -> None:
    """Add ``bells`` to the counters in the gate file ``fd``; the caller holds the gate's lock.

    A failure is swallowed: the transaction has committed already, and waiters fall back to
    their timer.
    """
    if not bells:
        return
    try:
        current = _unpack(os.pread(fd, _COUNTERS.size, 0))
        step = EVERYONE_STEP if bells & Bell.EVERYONE else 0
        os.pwrite(
            fd,
            _COUNTERS.pack(
                (current.queue + step + (1 if bells & Bell.QUEUE else 0)) & _MASK,
                (current.seats + step + (1 if bells & Bell.SEATS else 0)) & _MASK,
                (current.starts + step + (1 if bells & Bell.STARTS else 0)) & _MASK,
            ),
            0,
        )
    except OSError:
        pass


class Doorbell:
    """A waiter's read handle on one database's doorbell (the writer-gate file at ``path``).

    Open it with :meth:`open`, which returns ``None`` where the file cannot be opened
    (callers then poll without one). Safe to share between threads.
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def open(cls, path: str | None) -> Doorbell | None:
        """The doorbell of the gate file ``path`` (created if missing), or ``None``."""
        if path is None:
            return None
        try:
            return cls(path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError:
            return None

    def read(self) -> Chimes | None:
        """The counters now, or ``None`` if they cannot be read (or the doorbell is closed)."""
        try:
            return _unpack(os.pread(self._fd, _COUNTERS.size, 0))
        except OSError:
            return None

    def close(self) -> None:
        """Close the file (idempotent); :meth:`read` then returns ``None``."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
