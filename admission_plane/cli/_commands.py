"""The commands: ``db``, ``keys``, ``status``, ``events``, ``reap`` and ``demo``."""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import attrs
import sqlalchemy as sa
from alembic import command
from alembic.util import CommandError
from sqlalchemy.engine import URL, Connection
from sqlalchemy.pool import NullPool

from ..errors import AdmissionDatabaseError, AdmissionError, MissingKeyError, SchemaIntegrityError
from ..keys import ENCRYPTION_KEY_VARIABLE, default_key_file, generate_key_file
from ..migrate import HEAD_REVISION, alembic_config, current_revision, downgrade, upgrade
from ..policy import Policy
from ..store.engine import create_admission_engine
from ..store.failures import connect, is_corruption, sqlite_integrity_problems, translated
from ..store.schema_check import check_schema
from ..store.schema_spec import foreign_tables
from ..store.statements.queue import INDEX_CHECKS
from ..store.status import PlaneStatus, read_status
from ..values import BudgetWindow
from ._common import (
    EXIT_FOUND_PROBLEM,
    EXIT_OK,
    CommandFailed,
    assert_migrated,
    database_url,
    duration,
    emit,
    first_line,
    interruptible,
    iso,
    now_ms,
    open_plane,
    print_event,
    shown,
    span,
)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Create, upgrade or adopt the schema; create the key file when no keys exist yet."""
    url = database_url(args, must_exist=False)
    upgrade(url, args.revision, allow_foreign_tables=args.allow_foreign_tables)
    revision = current_revision(url)
    created = None
    key_file = Path(args.key_file) if args.key_file else default_key_file()
    if ENCRYPTION_KEY_VARIABLE not in os.environ and not os.path.lexists(key_file):
        try:
            created = str(generate_key_file(key_file))
        except MissingKeyError:
            if not os.path.lexists(key_file):
                raise  # not created by another `db upgrade` running at the same time
    message = f"database {shown(url)} is at revision {revision}"
    if created:
        message += f"\ncreated key file {created} (mode 0600)"
    emit(args, {"database": shown(url), "revision": revision, "created_key_file": created}, message)
    return EXIT_OK


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    """Downgrade the schema to a revision."""
    url = database_url(args)
    downgrade(url, args.revision, allow_foreign_tables=args.allow_foreign_tables)
    revision = current_revision(url)
    emit(
        args,
        {"database": shown(url), "revision": revision},
        f"database {shown(url)} is at revision {revision or 'base (no admission tables)'}",
    )
    return EXIT_OK


def cmd_db_current(args: argparse.Namespace) -> int:
    """Print the database's revision and the head."""
    url = database_url(args)
    revision = current_revision(url)
    state = "head" if revision == HEAD_REVISION else ("not migrated" if revision is None else "behind head")
    emit(
        args,
        {"database": shown(url), "revision": revision, "head": HEAD_REVISION},
        f"{revision or 'none'} ({state}; head is {HEAD_REVISION})",
    )
    return EXIT_OK


def cmd_db_check(args: argparse.Namespace) -> int:
    """Run SQLite's own integrity check, compare the schema with the model and run the schema
    integrity check (exit 1 on corruption or drift)."""
    url = database_url(args)
    check_sqlite_integrity(url)
    assert_migrated(url)
    if not args.allow_foreign_tables:
        refuse_foreign_tables(url)
    try:
        config = alembic_config(url=url)
        config.attributes["allow_foreign_tables"] = args.allow_foreign_tables
        config.stdout = io.StringIO()  # alembic prints its own verdict; we print ours
        command.check(config)
    except CommandError as error:
        raise CommandFailed(f"schema differs from the model: {first_line(error)}", EXIT_FOUND_PROBLEM) from None
    engine = create_admission_engine(url)
    try:
        with engine.connect() as connection:
            try:
                check_schema(connection, allow_foreign_tables=args.allow_foreign_tables)
                check_admission_index(connection)
            except AdmissionError as error:
                raise CommandFailed(str(error), EXIT_FOUND_PROBLEM) from None
            finally:
                connection.rollback()
    finally:
        engine.dispose()
    emit(
        args, {"database": shown(url), "ok": True}, f"database {shown(url)} is at head and matches the schema contract"
    )
    return EXIT_OK


def check_admission_index(connection: Connection) -> None:
    """Raise :class:`SchemaIntegrityError` unless the admission index matches the queue exactly
    (every queued request with a payload, and the head of every group)."""
    for table, expected, actual in INDEX_CHECKS:
        for first, second in ((expected, actual), (actual, expected)):
            if connection.exec_driver_sql(f"SELECT count(*) FROM ({first} EXCEPT {second}) d").scalar():
                raise SchemaIntegrityError(f"admission index {table} does not match the queue")


def refuse_foreign_tables(url: URL) -> None:
    """Fail the check (exit 1), in one line, when the database holds another application's tables."""
    engine = create_admission_engine(url, poolclass=NullPool)
    try:
        with connect(engine) as connection, translated(url, engine.dialect):
            inspector = sa.inspect(connection)
            foreign = foreign_tables([*inspector.get_table_names(), *inspector.get_view_names()])
    finally:
        engine.dispose()
    if foreign:
        raise CommandFailed(
            f"database {shown(url)} holds tables the admission plane does not own: {', '.join(foreign)} "
            "(if it is shared with another application, check it with --allow-foreign-tables)",
            EXIT_FOUND_PROBLEM,
        )


def check_sqlite_integrity(url: URL) -> None:
    """``PRAGMA integrity_check`` of an SQLite file; a corrupt file fails the check (exit 1)."""
    if url.get_backend_name() != "sqlite":
        return
    engine = create_admission_engine(url, poolclass=NullPool)
    try:
        with connect(engine) as connection, translated(url, engine.dialect):
            problems = sqlite_integrity_problems(connection)
    except AdmissionDatabaseError as error:
        if not is_corruption(error):
            raise
        problems = [str(error)]
    finally:
        engine.dispose()
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CommandFailed(f"SQLite integrity check failed for {shown(url)}: {problems[0]}{more}", EXIT_FOUND_PROBLEM)


def cmd_keys_init(args: argparse.Namespace) -> int:
    """Create a key file with two fresh keys (never printed)."""
    path = generate_key_file(Path(args.key_file) if args.key_file else default_key_file())
    emit(args, {"key_file": str(path)}, f"created key file {path} (mode 0600)")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Print queue, seats, leases, cooldowns, drain state, the live policy's lanes, keys and pauses,
    and its budget windows."""
    plane = open_plane(args)
    try:
        now = now_ms()
        status = attrs.evolve(read_status(plane.engine, now), budgets=plane.budget_status(now))
    finally:
        plane.close()
    if args.json:
        emit(args, status.as_json(), "")
        return EXIT_OK
    seats_of = (
        f"{status.durable_policy[0]} (durable policy)"
        if status.durable_policy is not None
        else f"{Policy().max_active_turns} (default policy; no durable policy claimed)"
    )
    lines = [
        f"queue depth      {status.queue_depth} ({status.queued_with_payload} with payload)",
        f"oldest wait      {duration(status.oldest_wait_ms)}",
        f"seats in use     {status.seats_in_use} of {seats_of}",
        "leases by phase  "
        + (
            ", ".join(
                f"{phase} {count}"
                + (f" ({status.suspects_by_phase[phase]} suspect)" if phase in status.suspects_by_phase else "")
                for phase, count in sorted(status.leases_by_phase.items())
            )
            or "none"
        ),
        "cooldowns        "
        + (
            ", ".join(
                f"{provider}/{model} {duration(not_before - status.now)} left"
                for provider, model, not_before in status.cooldowns
            )
            or "none"
        ),
        f"drain state      {status.drain_state or 'steady (no durable policy)'}",
        "requests         "
        + (", ".join(f"{state} {count}" for state, count in status.requests_by_state.items()) or "none"),
        f"events           {status.event_count} (last seq {status.last_event_seq})",
        f"policy revision  {status.policy_revision or 'none (durable seats, connectors own policy)'}",
        "lanes            "
        + (
            ", ".join(
                f"{lane} {queued} queued ({ready} ready)" for lane, (queued, ready) in status.queue_by_lane.items()
            )
            or "none queued"
        ),
        "keys             "
        + (
            ", ".join(
                f"{provider}/{model} {queued} queued, {seats} seats" for provider, model, queued, seats in status.keys
            )
            or "none"
        ),
        f"full sessions    {'no session limit' if status.sessions_at_limit is None else status.sessions_at_limit}",
        "paused           "
        + (
            ", ".join(
                ("everything" if not lane and not provider else f"lane {lane}" if lane else f"{provider}/{model}")
                + f" since {iso(since)}"
                for lane, provider, model, since in status.pauses
            )
            or "nothing"
        ),
        *_budget_lines(status),
    ]
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _budget_lines(status: PlaneStatus) -> list[str]:
    """One line per budget window of the policy in force (the first one headed ``budgets``)."""
    if not status.budgets:
        return [
            "budgets          "
            + (
                "none in the live policy"
                if status.policy_revision
                else "none known (no live policy revision: each connector applies its own policy's budgets)"
            )
        ]
    return [
        ("budgets          " if index == 0 else " " * 17) + budget_window_text(window, status.now)
        for index, window in enumerate(status.budgets)
    ]


def budget_window_text(window: BudgetWindow, now: int) -> str:
    """A budget window for people: its key and span, requests and tokens against the limits, the next reset."""
    key = f"{window.provider}/{window.model}" if window.model is not None else f"{window.provider} (all models)"
    requests = f"requests {window.requests}" + (
        " (no limit)"
        if window.max_requests is None
        else f" of {window.max_requests} ({window.remaining_requests} left)"
    )
    tokens = f"tokens {window.reserved_tokens} reserved + {window.used_tokens} used" + (
        " (no limit)" if window.max_tokens is None else f" of {window.max_tokens} ({window.remaining_tokens} left)"
    )
    reset = (
        "nothing counted"
        if window.next_reset_at is None
        else f"next reset in {span(max(0, window.next_reset_at - now))}"
    )
    return f"{key} per {span(window.window_ms)}: {requests}; {tokens}; {reset}"


def cmd_events(args: argparse.Namespace) -> int:
    """Print the journal, oldest first (``--follow`` until interrupted)."""
    plane = open_plane(args)
    stop = interruptible()
    after = args.after
    try:
        while True:
            page = plane.read_sanitized_events(after_event_seq=after, limit=args.limit)
            for event in page:
                print_event(args, event)
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
    """Run one reaper pass with this host's ``/proc`` evidence."""
    plane = open_plane(args, keys=True)
    try:
        summary = plane.reap_suspects(now_ms())
    finally:
        plane.close()
    data = attrs.asdict(summary)
    text = "reaper pass: " + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in data.items())
    if summary.untrusted:
        rows = "row" if summary.untrusted == 1 else "rows"
        text += (
            f"\n{summary.untrusted} recovery {rows} could not be trusted: left as they are and journalled "
            f"(recovery_row_retained); every other lease was judged. Free such a seat by hand with "
            f"`admission-plane release LEASE_ID` once you have checked it."
        )
    emit(args, data, text)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo (see :mod:`admission_plane.demo`)."""
    from ..demo import DemoOptions, run_demo  # the demo's worker machinery loads only when asked for

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
