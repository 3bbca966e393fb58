"""Pages each writing unit of a turn writes on SQLite: ``python -m benchmarks.wal_pages [--dir DIR]``.

Every writing unit appends one frame a page it changed to the ``-wal`` file; with several processes on one
file, every unit also reads back about as many pages (each commit by another connection empties a
connection's page cache), so these counts are what a unit costs the writer gate beyond its Python. One
process on a fresh migrated file runs warm-up turns, empties the ``-wal`` file (``wal_checkpoint(TRUNCATE)``),
then one turn of each shape: admitted with its enqueue (``admit_as``), and a waiter's (enqueued while every
seat is held, admitted and started by ``wait_for_admission(start=True)`` once a seat is freed). After each
unit it reads the frames the unit appended and names the b-tree of each page (SQLite's ``dbstat`` table).
Nothing here is timed.
"""

from __future__ import annotations

import argparse
import collections
import os
import sqlite3
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

from admission_plane import AdmissionPlane, AdmittedLease, LiveTurnCompletion, Policy
from admission_plane.evidence import capture
from admission_plane.store.group_commit import wal_path

from ._support import CONTENT_KEY, ENCRYPTION_KEY, dispatch_record, migrated, request_fields, wall_ms

_WAL_HEADER = 32
_FRAME_HEADER = 24
#: One seat, so that a second request waits for the first turn's seat.
_POLICY = Policy(1, 1, 0, 1_800_000, 30_000)

Unit = tuple[str, Callable[[], object]]


def _frames(wal: Path, offset: int, page_size: int) -> tuple[list[int], int]:
    """The page numbers of the frames from ``offset`` to the next commit frame, and the offset after it."""
    data = wal.read_bytes()
    pages, position = [], max(offset, _WAL_HEADER)
    while position + _FRAME_HEADER + page_size <= len(data):
        page, size_after_commit = struct.unpack(">II", data[position : position + 8])
        pages.append(page)
        position += _FRAME_HEADER + page_size
        if size_after_commit:
            break
    return pages, position


def _names(inspector: sqlite3.Connection) -> dict[int, str]:
    """Each page's b-tree (table or index name), from ``dbstat``."""
    return {page: name for name, page in inspector.execute("SELECT name, pageno FROM dbstat")}


class _Turns:
    """Drives turns on ``plane`` one writing unit at a time (each step returns after one commit)."""

    def __init__(self, plane: AdmissionPlane) -> None:
        self.plane = plane
        self.owner = plane.owner_identity.owner_instance_id
        self.child = capture(os.getpid())

    def enqueue(self, request_id: str, *, admit: bool) -> AdmittedLease | None:
        fields = request_fields(request_id, wall_ms(), agent_id=f"agent-{request_id}")
        return self.plane.enqueue_with_payload(**fields, admit_as=self.owner if admit else None).admitted

    def after_admission(self, lease: AdmittedLease) -> Iterator[Unit]:
        """The units of a turn after its admission: start (unless the admission started it), intent, active,
        completion."""
        plane = self.plane
        if not lease.starting:
            yield "start", lambda: plane.mark_starting(lease, wall_ms())
        record = dispatch_record(plane, lease, self.child)
        yield "dispatch intent", lambda: plane.commit_dispatch_intent(record)
        yield "active", lambda: plane.mark_active(lease, wall_ms())
        yield "completion", lambda: plane.complete_live_turn(lease, wall_ms(), LiveTurnCompletion("completed"))

    def admitted(self, request_id: str) -> Iterator[Unit]:
        """The units of a turn admitted with its enqueue (a seat must be free)."""
        leases: list[AdmittedLease | None] = []
        yield "enqueue + admission", lambda: leases.append(self.enqueue(request_id, admit=True))
        assert leases[0] is not None, "a free seat admits with the enqueue"
        yield from self.after_admission(leases[0])


def measure(folder: Path) -> dict[str, list[tuple[str, collections.Counter[str]]]]:
    """Per turn shape, each writing unit's name and the b-trees of the pages it wrote (a page twice: counted twice)."""
    database = migrated(folder / "pages.sqlite")
    wal = Path(wal_path(str(database)))
    plane = AdmissionPlane(
        str(database), policy=_POLICY, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY
    )
    # One more connection, outside the plane: it empties the ``-wal`` file and names the pages.
    with closing(plane), closing(sqlite3.connect(database)) as inspector:
        turns = _Turns(plane)
        for index in range(3):
            for _name, unit in turns.admitted(f"warm-{index}"):
                unit()
        (page_size,) = inspector.execute("PRAGMA page_size").fetchone()
        shapes: dict[str, list[tuple[str, collections.Counter[str]]]] = {}

        def run(shape: str, units: Iterator[Unit]) -> None:
            inspector.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            offset, written = 0, []
            for name, unit in units:
                unit()
                pages, offset = _frames(wal, offset, page_size)
                if name:  # an unnamed unit is another turn's: its frames are skipped
                    names = _names(inspector)
                    written.append((name, collections.Counter(names.get(page, f"page {page}") for page in pages)))
            shapes[shape] = written

        run("admitted with its enqueue", turns.admitted("at-once"))

        holder = turns.enqueue("holder", admit=True)
        assert holder is not None, "a free seat admits with the enqueue"
        holding = list(turns.after_admission(holder))
        for _name, unit in holding[:-1]:
            unit()  # the holder's turn is active: the one seat is held

        def waiting() -> Iterator[Unit]:
            leases: list[AdmittedLease | None] = []
            yield "enqueue", lambda: turns.enqueue("waiter", admit=True)  # no free seat: queued
            yield "", holding[-1][1]  # the holder's completion frees the seat (not counted)

            def admit() -> None:
                leases.append(plane.wait_for_admission("waiter", turns.owner, start=True))

            yield "admission + start", admit
            assert leases[0] is not None, "the freed seat admits the waiter"
            yield from turns.after_admission(leases[0])

        run("a waiter's", waiting())
        return shapes


def main(argv: list[str] | None = None) -> None:
    """Print the pages each writing unit of the two turn shapes wrote."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="folder for the SQLite file (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        shapes = measure(Path(folder))
    for shape, units in shapes.items():
        total = sum(sum(pages.values()) for _name, pages in units)
        print(f"{shape} turn: {len(units)} writing units, {total} pages")
        for name, pages in units:
            trees = ", ".join(f"{tree} x{count}" if count > 1 else tree for tree, count in sorted(pages.items()))
            print(f"  {name}: {sum(pages.values())} pages: {trees}")


if __name__ == "__main__":
    main()
