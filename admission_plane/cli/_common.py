"""What every command shares: the database it names, its keys, its output, its errors."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import attrs
import sqlalchemy as sa
from sqlalchemy.engine import URL

from ..clock import wall_clock_ms
from ..evidence import format_created_at
from ..keys import KeyPair, load_keys, state_directory
from ..migrate import current_revision
from ..plane import AdmissionPlane
from ..store.engine import DATABASE_URL_VARIABLE, create_admission_engine, parse_url, redacted_url
from ..values import SanitizedEvent

PROG = "admission-plane"
DATABASE_FILE_NAME = "admission.sqlite"
EXIT_OK, EXIT_FOUND_PROBLEM, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandFailed(Exception):
    """A one-line failure the command line reports as is."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


def default_database() -> Path:
    """The default SQLite file: ``admission.sqlite`` in the state directory."""
    return state_directory() / DATABASE_FILE_NAME


def database_url(args: argparse.Namespace, *, must_exist: bool = True) -> URL:
    """The database ``--db`` names (else the environment's, else the default file)."""
    text = args.db or os.environ.get(DATABASE_URL_VARIABLE) or str(default_database())
    url = parse_url(text)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        if must_exist and not path.exists():
            raise CommandFailed(f"database {path} does not exist (create it with `{PROG} db upgrade`)")
        if not must_exist:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return url


def shown(url: URL) -> str:
    """How a database is named in output: an SQLite file by its path, a server URL without any password."""
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return redacted_url(url)


def assert_migrated(url: URL) -> None:
    """Refuse a database Alembic never touched with an actionable message (the integrity check follows)."""
    if current_revision(url) is not None:
        return
    engine = create_admission_engine(url)
    try:
        with engine.connect() as connection:
            tables = set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()
    if not tables - {"alembic_version", "sqlite_sequence"}:
        raise CommandFailed(f"database {shown(url)} is not migrated (run `{PROG} db upgrade`)")
    if "schema_migrations" in tables:
        raise CommandFailed(
            f"database {shown(url)} was written by the original connector; adopt it with `{PROG} db upgrade`"
        )
    raise CommandFailed(f"database {shown(url)} is not an admission plane (it has no alembic_version table)")


def open_plane(args: argparse.Namespace, *, keys: bool = False) -> AdmissionPlane:
    """The plane on the named database (with the keys, when the command needs them)."""
    url = database_url(args)
    key_pair = load_key_pair(args) if keys else None
    assert_migrated(url)
    return AdmissionPlane(
        url,
        encryption_key=None if key_pair is None else key_pair.encryption_key,
        content_fingerprint_key=None if key_pair is None else key_pair.content_fingerprint_key,
        allow_foreign_tables=getattr(args, "allow_foreign_tables", False),
    )


def load_key_pair(args: argparse.Namespace, *, create: bool = False) -> KeyPair:
    """The keys from the environment or ``--key-file`` (never from the command line)."""
    return load_keys(args.key_file, create=create)


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    print(json.dumps(data, sort_keys=True) if args.json else text, flush=True)


def iso(epoch_ms: int) -> str:
    """An epoch-millisecond time as canonical UTC."""
    return format_created_at(epoch_ms) if epoch_ms >= 0 else str(epoch_ms)


def now_ms() -> int:
    """The operator's clock."""
    return wall_clock_ms()


def print_event(args: argparse.Namespace, event: SanitizedEvent) -> None:
    """One journal event, as a line of text or of JSON."""
    if args.json:
        print(json.dumps(attrs.asdict(event), sort_keys=True), flush=True)
        return
    print(
        f"{event.event_seq:>8}  {iso(event.occurred_at)}  {event.kind:<31} "
        f"{event.from_state} -> {event.to_state}  {event.correlation_hmac[:12]}",
        flush=True,
    )


def duration(ms: int | None) -> str:
    """Milliseconds for people."""
    if ms is None:
        return "-"
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def span(ms: int) -> str:
    """A length of time for people: in whole hours or minutes when it is one (a budget window), else in
    the largest unit that keeps it short (a time to a reset)."""
    for unit, size in (("h", 3_600_000), ("min", 60_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    if ms < 10_000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1_000:.1f} s"
    return f"{ms / 60_000:.1f} min" if ms < 7_200_000 else f"{ms / 3_600_000:.1f} h"


def first_line(error: BaseException) -> str:
    """The first line of an error's message (a driver's own message when SQLAlchemy wraps it)."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line.split(" (Background on this error at")[0]


class StopFlag:
    """Set by SIGINT/SIGTERM so ``--follow`` ends cleanly with status 0."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self, *_: object) -> None:
        """Ask the loop to stop (a signal handler)."""
        self._event.set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; ``True`` if asked to stop meanwhile."""
        return self._event.wait(seconds)


def interruptible() -> StopFlag:
    """A stop flag that SIGINT and SIGTERM set."""
    flag = StopFlag()
    signal.signal(signal.SIGINT, flag.set)
    signal.signal(signal.SIGTERM, flag.set)
    return flag
