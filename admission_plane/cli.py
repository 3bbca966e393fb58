"""``admission-plane``: the operator's command line.

Commands: ``db upgrade|downgrade|current|check``, ``keys init``, ``status``, ``events``,
``reap`` and ``demo``. Every command takes ``--db`` (a URL or an SQLite path; default
``$ADMISSION_PLANE_DATABASE_URL``, else ``admission.sqlite`` in the state directory).
Keys come from the environment or the key file (see :mod:`admission_plane.keys`), never
from the command line, and are never printed.

Errors are one line on standard error, ``admission-plane: error: <message>``, with exit
status 2 (1 when a check ran and found a problem); never a traceback. Set
``ADMISSION_PLANE_DEBUG=1`` to see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from .errors import AdmissionError, InvalidInputError

__all__ = ["main"]

PROG = "admission-plane"
DATABASE_FILE_NAME = "admission.sqlite"
URL_VARIABLE = "ADMISSION_PLANE_DATABASE_URL"
EXIT_OK, EXIT_FOUND_PROBLEM, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandFailed(Exception):
    """A one-line failure the command line reports as is."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


# --- database and keys ---------------------------------------------------------------------------


def default_database() -> Path:
    """The default SQLite file: ``admission.sqlite`` in the state directory."""
    from .keys import state_directory

    return state_directory() / DATABASE_FILE_NAME


def _database_url(args: argparse.Namespace, *, must_exist: bool = True) -> URL:
    from .db import parse_url

    text = args.db or os.environ.get(URL_VARIABLE) or str(default_database())
    url = parse_url(text)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        if must_exist and not path.exists():
            raise CommandFailed(f"database {path} does not exist (create it with `{PROG} db upgrade`)")
        if not must_exist:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return url


def _shown(url: URL) -> str:
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return url.render_as_string(hide_password=True)


def _assert_migrated(url: URL) -> None:
    """Refuse a database Alembic never touched with an actionable message (the integrity check follows)."""
    import sqlalchemy as sa

    from .migrate import current_revision

    if current_revision(url) is not None:
        return
    from .db import create_admission_engine

    engine = create_admission_engine(url)
    try:
        with engine.connect() as connection:
            tables = set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()
    if not tables - {"alembic_version", "sqlite_sequence"}:
        raise CommandFailed(f"database {_shown(url)} is not migrated (run `{PROG} db upgrade`)")
    if "schema_migrations" in tables:
        raise CommandFailed(f"database {_shown(url)} was written by the original connector; "
                            f"adopt it with `{PROG} db upgrade`")
    raise CommandFailed(f"database {_shown(url)} is not an admission plane (it has no alembic_version table)")


def _open_plane(args: argparse.Namespace, *, keys: bool = False) -> Any:
    from .service import AdmissionPlane

    url = _database_url(args)
    key_pair = _load_keys(args) if keys else None
    _assert_migrated(url)
    return AdmissionPlane(
        url,
        encryption_key=None if key_pair is None else key_pair.encryption_key,
        content_fingerprint_key=None if key_pair is None else key_pair.content_fingerprint_key,
    )


def _load_keys(args: argparse.Namespace, *, create: bool = False) -> Any:
    from .keys import load_keys

    return load_keys(args.key_file, create=create)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, sort_keys=True) if args.json else text, flush=True)


def _iso(epoch_ms: int) -> str:
    from .evidence import format_created_at

    return format_created_at(epoch_ms) if epoch_ms >= 0 else str(epoch_ms)


def _now() -> int:
    return time.time_ns() // 1_000_000


# --- commands --------------------------------------------------------------------------------------


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from .keys import ENCRYPTION_KEY_VARIABLE, default_key_file, generate_key_file
    from .migrate import current_revision, upgrade

    url = _database_url(args, must_exist=False)
    upgrade(url, args.revision)
    revision = current_revision(url)
    created = None
    key_file = Path(args.key_file) if args.key_file else default_key_file()
    if ENCRYPTION_KEY_VARIABLE not in os.environ and not os.path.lexists(key_file):
        created = str(generate_key_file(key_file))
    message = f"database {_shown(url)} is at revision {revision}"
    if created:
        message += f"\ncreated key file {created} (mode 0600)"
    _emit(args, {"database": _shown(url), "revision": revision, "created_key_file": created}, message)
    return EXIT_OK


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from .migrate import current_revision, downgrade

    url = _database_url(args)
    downgrade(url, args.revision)
    revision = current_revision(url)
    _emit(args, {"database": _shown(url), "revision": revision},
          f"database {_shown(url)} is at revision {revision or 'base (no admission tables)'}")
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace) -> int:
    from .migrate import HEAD_REVISION, current_revision

    url = _database_url(args)
    revision = current_revision(url)
    state = "head" if revision == HEAD_REVISION else ("not migrated" if revision is None else "behind head")
    _emit(args, {"database": _shown(url), "revision": revision, "head": HEAD_REVISION},
          f"{revision or 'none'} ({state}; head is {HEAD_REVISION})")
    return EXIT_OK


def cmd_db_check(args: argparse.Namespace) -> int:
    from alembic import command
    from alembic.util import CommandError

    from .db import create_admission_engine
    from .migrate import alembic_config
    from .schema_check import check_schema

    url = _database_url(args)
    _assert_migrated(url)
    try:
        config = alembic_config(url=url)
        config.stdout = io.StringIO()  # alembic prints its own verdict; we print ours
        command.check(config)
    except CommandError as error:
        raise CommandFailed(f"schema differs from the model: {_first_line(error)}", EXIT_FOUND_PROBLEM) from None
    engine = create_admission_engine(url)
    try:
        with engine.connect() as connection:
            try:
                check_schema(connection)
            except AdmissionError as error:
                raise CommandFailed(str(error), EXIT_FOUND_PROBLEM) from None
            finally:
                connection.rollback()
    finally:
        engine.dispose()
    _emit(args, {"database": _shown(url), "ok": True},
          f"database {_shown(url)} is at head and matches the schema contract")
    return EXIT_OK


def cmd_keys_init(args: argparse.Namespace) -> int:
    from .keys import default_key_file, generate_key_file

    path = generate_key_file(Path(args.key_file) if args.key_file else default_key_file())
    _emit(args, {"key_file": str(path)}, f"created key file {path} (mode 0600)")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from ._status import read_status
    from .policy import Policy

    plane = _open_plane(args)
    try:
        status = read_status(plane.engine, _now())
    finally:
        plane.close()
    if args.json:
        _emit(args, status.as_json(), "")
        return EXIT_OK
    seats_of = (
        f"{status.durable_policy[0]} (durable policy)"
        if status.durable_policy is not None
        else f"{Policy().max_active_turns} (default policy; no durable policy claimed)"
    )
    lines = [
        f"queue depth      {status.queue_depth} ({status.queued_with_payload} with payload)",
        f"oldest wait      {_duration(status.oldest_wait_ms)}",
        f"seats in use     {status.seats_in_use} of {seats_of}",
        "leases by phase  " + (", ".join(
            f"{phase} {count}" + (f" ({status.suspects_by_phase[phase]} suspect)"
                                   if phase in status.suspects_by_phase else "")
            for phase, count in sorted(status.leases_by_phase.items())
        ) or "none"),
        "cooldowns        " + (", ".join(
            f"{provider}/{model} {_duration(not_before - status.now)} left"
            for provider, model, not_before in status.cooldowns
        ) or "none"),
        f"drain state      {status.drain_state or 'steady (no durable policy)'}",
        "requests         " + (", ".join(f"{state} {count}" for state, count in status.requests_by_state.items())
                               or "none"),
        f"events           {status.event_count} (last seq {status.last_event_seq})",
    ]
    print("\n".join(lines), flush=True)
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    plane = _open_plane(args)
    stop = _interruptible()
    after = args.after
    try:
        while True:
            page = plane.read_sanitized_events(after_event_seq=after, limit=args.limit)
            for event in page:
                _print_event(args, event)
                after = event.event_seq
            if not args.follow:
                if not args.json and len(page) == args.limit:
                    print(f"(more: --after {after})", flush=True)
                return EXIT_OK
            if len(page) < args.limit and stop.wait(args.interval):
                return EXIT_OK
    finally:
        plane.close()


def cmd_reap(args: argparse.Namespace) -> int:
    import attrs

    plane = _open_plane(args, keys=True)
    try:
        summary = plane.reap_suspects(_now())
    finally:
        plane.close()
    data = attrs.asdict(summary)
    _emit(args, data, "reaper pass: " + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in data.items()))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run_demo

    options = DemoOptions(
        agents=args.agents,
        turns=args.turns,
        seats=args.seats,
        starts=args.starts,
        start_interval_ms=args.start_interval_ms,
        cooldown_ms=args.cooldown_ms,
        models=tuple(args.models.split(",")),
        provider_ms=(args.provider_min_ms, args.provider_max_ms),
        capacity_fault=not args.no_capacity_fault,
        kill_fault=not args.no_kill_fault,
        database=args.db,
        key_file=args.key_file,
        json_summary=args.json,
        progress=args.progress,
    )
    return run_demo(options)


# --- output helpers -----------------------------------------------------------------------------------


def _print_event(args: argparse.Namespace, event: Any) -> None:
    if args.json:
        import attrs

        print(json.dumps(attrs.asdict(event), sort_keys=True), flush=True)
        return
    print(
        f"{event.event_seq:>8}  {_iso(event.occurred_at)}  {event.kind:<31} "
        f"{event.from_state} -> {event.to_state}  {event.correlation_hmac[:12]}",
        flush=True,
    )


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line.split(" (Background on this error at")[0]


class _StopFlag:
    """Set by SIGINT/SIGTERM so ``--follow`` ends cleanly with status 0."""

    def __init__(self) -> None:
        import threading

        self._event = threading.Event()

    def set(self, *_: object) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)


def _interruptible() -> _StopFlag:
    flag = _StopFlag()
    signal.signal(signal.SIGINT, flag.set)
    signal.signal(signal.SIGTERM, flag.set)
    return flag


# --- the parser ----------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``admission-plane`` (every command has ``--help``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", metavar="URL",
        help=f"database URL or SQLite file path (default: ${URL_VARIABLE}, else {default_database()})",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    common.add_argument(
        "--key-file", metavar="PATH",
        help="key file (default: the state directory's; the environment's keys win when set)",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate a durable, cross-process admission plane for AI-agent turns.",
        epilog="Keys come from ADMISSION_PLANE_ENCRYPTION_KEY and ADMISSION_PLANE_CONTENT_KEY (64 hex "
               "characters each) or from the key file; never from the command line.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    db = commands.add_parser("db", help="migrate and inspect the schema (Alembic)",
                             description="Run the packaged Alembic history against the database.")
    db_commands = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = db_commands.add_parser("upgrade", parents=[common], help="create or upgrade the schema",
                                     description="Create or upgrade (or adopt a seed database) to REVISION; "
                                                 "creates the key file when no keys exist yet.")
    upgrade.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    upgrade.set_defaults(handler=cmd_db_upgrade)
    downgrade = db_commands.add_parser("downgrade", parents=[common], help="downgrade the schema",
                                       description="Downgrade to REVISION ('base' drops every admission table).")
    downgrade.add_argument("revision", help="target revision, e.g. 0002_seed_v2, -1 or base")
    downgrade.set_defaults(handler=cmd_db_downgrade)
    current = db_commands.add_parser("current", parents=[common], help="print the current revision",
                                     description="Print the database's Alembic revision and the head.")
    current.set_defaults(handler=cmd_db_current)
    check = db_commands.add_parser("check", parents=[common], help="verify the schema (exit 1 on drift)",
                                   description="Compare the database with the model (alembic check) and run "
                                               "the fail-closed schema integrity check.")
    check.set_defaults(handler=cmd_db_check)

    keys = commands.add_parser("keys", help="manage the key file", description="Manage the key file.")
    keys_commands = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    init = keys_commands.add_parser("init", parents=[common], help="create a new key file (mode 0600)",
                                    description="Create a key file with two fresh random keys (never printed).")
    init.set_defaults(handler=cmd_keys_init)

    status = commands.add_parser("status", parents=[common], help="queue, seats, leases, cooldowns, drain",
                                 description="Queue depth, oldest wait, seats in use against the policy, "
                                             "leases by phase with suspects, active cooldowns, drain state.")
    status.set_defaults(handler=cmd_status)

    events = commands.add_parser("events", parents=[common], help="read the sanitized journal",
                                 description="Print the identifier-free event journal, oldest first.")
    events.add_argument("--after", type=_non_negative, default=0, metavar="SEQ",
                        help="start after this event sequence number (default 0)")
    events.add_argument("--limit", type=_positive, default=100, metavar="N", help="page size, 1..1000 (default 100)")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")
    events.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                        help="polling interval of --follow (default 0.5)")
    events.set_defaults(handler=cmd_events)

    reap = commands.add_parser("reap", parents=[common], help="run one reaper pass with live /proc evidence",
                               description="Release seats whose connector, child and process group are "
                                           "proved gone; mark suspects; never requeue.")
    reap.set_defaults(handler=cmd_reap)

    demo = commands.add_parser(
        "demo", parents=[common], help="run agents through the plane with injected faults",
        description="Start worker processes that submit turns through the high-level API on a fresh SQLite "
                    "file, inject a provider capacity failure and a SIGKILL mid-dispatch, and check the "
                    "invariants. Exit status 1 if any invariant was violated.",
    )
    demo.add_argument("--agents", type=_positive, default=6, help="worker processes (default 6)")
    demo.add_argument("--turns", type=_positive, default=5, help="turns per agent (default 5)")
    demo.add_argument("--seats", type=_positive, default=3, help="policy: max active turns (default 3)")
    demo.add_argument("--starts", type=_positive, default=2, help="policy: max concurrent starts (default 2)")
    demo.add_argument("--start-interval-ms", type=_non_negative, default=0, help="policy: min start interval")
    demo.add_argument("--cooldown-ms", type=_non_negative, default=4_000,
                      help="policy: capacity cooldown (default 4000)")
    demo.add_argument("--models", default="model-a,model-b", help="comma-separated models (default model-a,model-b)")
    demo.add_argument("--provider-min-ms", type=_non_negative, default=200, help="shortest provider call")
    demo.add_argument("--provider-max-ms", type=_non_negative, default=700, help="longest provider call")
    demo.add_argument("--no-capacity-fault", action="store_true", help="do not inject a provider capacity failure")
    demo.add_argument("--no-kill-fault", action="store_true", help="do not SIGKILL a worker mid-dispatch")
    demo.add_argument("--progress", choices=("auto", "live", "lines", "none"), default="auto",
                      help="live redrawn line on a terminal, periodic lines otherwise (default auto)")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except CommandFailed as error:
        return _fail(str(error), error.status)
    except (AdmissionError, InvalidInputError) as error:
        return _fail(str(error), EXIT_ERROR)
    except Exception as error:  # the boundary: one line, never a traceback
        if os.environ.get("ADMISSION_PLANE_DEBUG"):
            raise
        return _fail(_describe(error), EXIT_ERROR)


def _describe(error: Exception) -> str:
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(error, SQLAlchemyError):
        return f"database error: {_first_line(error)}"
    if isinstance(error, OSError):
        return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    module = type(error).__module__.split(".")[0]
    if module == "alembic":
        return _first_line(error)
    return f"{type(error).__name__}: {_first_line(error)}"


def _fail(message: str, status: int) -> int:
    line = " ".join(message.split()) or "unknown error"
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
