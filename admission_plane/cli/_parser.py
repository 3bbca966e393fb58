"""The argument parser of ``admission-plane``."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import NoReturn

from ..store.engine import DATABASE_URL_VARIABLE
from ._commands import (
    cmd_db_check,
    cmd_db_current,
    cmd_db_downgrade,
    cmd_db_upgrade,
    cmd_demo,
    cmd_events,
    cmd_keys_init,
    cmd_status,
)
from ._common import EXIT_ERROR, PROG, default_database
from ._policy import add_scope_arguments, cmd_pause, cmd_policy_history, cmd_policy_set, cmd_policy_show, cmd_resume
from ._release import cmd_release
from ._serve import cmd_reap_or_dry_run, cmd_serve, package_version

#: The most worker processes, and turns per worker, the demo runs (its plan is built up front).
MAX_DEMO_AGENTS = 64
MAX_DEMO_TURNS = 1_000


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``admission-plane: error: ...`` (exit status 2), as the
    command line's other errors are; the usage stays on ``--help``."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix(PROG).strip()
        hint = f" (see `{self.prog} --help`)" if where else f" (see `{PROG} --help`)"
        self.exit(EXIT_ERROR, f"{PROG}: error: {' '.join(message.split())}{hint}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _at_most(maximum: int) -> Callable[[str], int]:
    """A positive integer of at most ``maximum`` (the demo's sizes: its plan is built before it starts)."""

    def parse(text: str) -> int:
        value = _positive(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}")
        return value

    return parse


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= threading.TIMEOUT_MAX:  # refuses NaN and infinities too: --follow would spin or crash
        raise argparse.ArgumentTypeError("must be a positive finite number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``admission-plane`` (every command has ``--help``)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--db",
        metavar="URL",
        help=f"database URL or SQLite file path (default: ${DATABASE_URL_VARIABLE}, else {default_database()})",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    common.add_argument(
        "--key-file",
        metavar="PATH",
        help="key file (default: the state directory's; the environment's keys win when set)",
    )

    sharing = _Parser(add_help=False)
    sharing.add_argument(
        "--allow-foreign-tables",
        action="store_true",
        help="the database is shared with another application's tables (by default it must be the plane's own)",
    )

    parser = _Parser(
        prog=PROG,
        description="Operate a durable, cross-process admission plane for AI-agent turns.",
        epilog="Keys come from ADMISSION_PLANE_ENCRYPTION_KEY and ADMISSION_PLANE_CONTENT_KEY (64 hex "
        "characters each) or from the key file; never from the command line.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    db = commands.add_parser(
        "db",
        help="migrate and inspect the schema (Alembic)",
        description="Run the packaged Alembic history against the database.",
    )
    db_commands = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = db_commands.add_parser(
        "upgrade",
        parents=[common, sharing],
        help="create or upgrade the schema",
        description="Create or upgrade (or adopt a seed database) to REVISION; "
        "creates the key file when no keys exist yet.",
    )
    upgrade.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    upgrade.set_defaults(handler=cmd_db_upgrade)
    downgrade = db_commands.add_parser(
        "downgrade",
        parents=[common, sharing],
        help="downgrade the schema",
        description="Downgrade to REVISION ('base' drops every admission table).",
    )
    downgrade.add_argument("revision", help="target revision, e.g. 0002_seed_v2, -1 or base")
    downgrade.set_defaults(handler=cmd_db_downgrade)
    current = db_commands.add_parser(
        "current",
        parents=[common],
        help="print the current revision",
        description="Print the database's Alembic revision and the head.",
    )
    current.set_defaults(handler=cmd_db_current)
    check = db_commands.add_parser(
        "check",
        parents=[common, sharing],
        help="verify the schema (exit 1 on drift)",
        description="Compare the database with the model (alembic check) and run "
        "the fail-closed schema integrity check.",
    )
    check.set_defaults(handler=cmd_db_check)

    keys = commands.add_parser("keys", help="manage the key file", description="Manage the key file.")
    keys_commands = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    init = keys_commands.add_parser(
        "init",
        parents=[common],
        help="create a new key file (mode 0600)",
        description="Create a key file with two fresh random keys (never printed).",
    )
    init.set_defaults(handler=cmd_keys_init)

    status = commands.add_parser(
        "status",
        parents=[common, sharing],
        help="queue, seats, leases, cooldowns, drain, lanes, keys, pauses, budgets",
        description="Queue depth, oldest wait, seats in use against the policy, "
        "leases by phase with suspects, active cooldowns, drain state, the live policy's lanes, keys and "
        "pauses, and each budget window: requests and tokens against its limits, what is left, the next reset.",
    )
    status.set_defaults(handler=cmd_status)

    events = commands.add_parser(
        "events",
        parents=[common, sharing],
        help="read the sanitized journal",
        description="Print the identifier-free event journal, oldest first.",
    )
    events.add_argument(
        "--after",
        type=_non_negative,
        default=0,
        metavar="SEQ",
        help="start after this event sequence number (default 0)",
    )
    events.add_argument("--limit", type=_positive, default=100, metavar="N", help="page size, 1..1000 (default 100)")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")
    events.add_argument(
        "--interval", type=_seconds, default=0.5, metavar="SECONDS", help="polling interval of --follow (default 0.5)"
    )
    events.set_defaults(handler=cmd_events)

    reap = commands.add_parser(
        "reap",
        parents=[common, sharing],
        help="run one reaper pass with live /proc evidence",
        description="Release seats whose connector, child and process group are "
        "proved gone; mark suspects; never requeue.",
    )
    reap.add_argument("--dry-run", action="store_true", help="print what a pass would do, changing nothing")
    reap.set_defaults(handler=cmd_reap_or_dry_run)

    release = commands.add_parser(
        "release",
        parents=[common, sharing],
        help="free one lease's seat by hand (no evidence needed)",
        description="Free the seat of lease LEASE_ID where no process evidence can: a host gone for good, or a "
        "recovery_required seat checked by hand. Asks on a terminal unless --yes. The request is never "
        "requeued: it ends cancelled before its dispatch intent, else stays recovery_required without a seat.",
    )
    release.add_argument("lease_id", metavar="LEASE_ID", help="the lease to release (leases.lease_id)")
    release.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    release.set_defaults(handler=cmd_release)

    serve = commands.add_parser(
        "serve",
        parents=[common, sharing],
        help="serve /metrics and the live dashboard (the web extra)",
        description="Serve Prometheus metrics (/metrics) and a live dashboard read from the database, on "
        "127.0.0.1 unless --host says otherwise; actions need the operator token "
        "($ADMISSION_PLANE_OPERATOR_TOKEN or --token-file). Stops gracefully on SIGINT or SIGTERM.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_non_negative, default=8321, help="port (default 8321; 0: any free port)")
    serve.add_argument(
        "--token-file", metavar="PATH", help="operator token file (default: operator-token in the state directory)"
    )
    serve.add_argument("--tick", type=_seconds, default=1.0, metavar="SECONDS", help="dashboard refresh (default 1)")
    serve.set_defaults(handler=cmd_serve)

    policy = commands.add_parser(
        "policy",
        help="show, set and list live policy revisions",
        description="The live admission policy: every connector applies a new revision at its next "
        "transaction, without a restart.",
    )
    policy_commands = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    show = policy_commands.add_parser(
        "show", parents=[common, sharing], help="print the policy in force", description="Print the policy in force."
    )
    show.set_defaults(handler=cmd_policy_show)
    set_ = policy_commands.add_parser(
        "set",
        parents=[common, sharing],
        help="put a new revision in force",
        description="Read a JSON object of policy fields (max_active_turns, max_concurrent_starts, "
        "min_start_interval_ms, queue_timeout_ms, capacity_cooldown_ms, lanes, key_limits, "
        "max_turns_per_session, session_overflow) and put the current policy with those fields changed in "
        "force as a new revision. Lowering a limit never stops a running turn.",
    )
    set_.add_argument("--file", "-f", required=True, metavar="PATH", help="the JSON file ('-': standard input)")
    set_.set_defaults(handler=cmd_policy_set)
    history = policy_commands.add_parser(
        "history",
        parents=[common, sharing],
        help="list revisions, newest first",
        description="List the live policy revisions, newest first.",
    )
    history.add_argument("--limit", type=_at_most(1000), default=20, metavar="N", help="how many, 1..1000 (default 20)")
    history.set_defaults(handler=cmd_policy_history)

    for name, handler, verb in (("pause", cmd_pause, "Pause"), ("resume", cmd_resume, "Resume")):
        steer = commands.add_parser(
            name,
            parents=[common, sharing],
            help=f"{name} admission (everything, a lane or a provider/model key)",
            description=f"{verb} admission: everything, one --lane, or one --provider/--model key. Running turns "
            "go on and queue time-outs still apply.",
        )
        add_scope_arguments(steer)
        steer.set_defaults(handler=handler)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="run agents through the plane with injected faults",
        description="Start worker processes that submit turns through the high-level API on a fresh SQLite "
        "file, inject a provider capacity failure and a SIGKILL mid-dispatch, and check the "
        "invariants. Exit status 1 if any invariant was violated.",
    )
    demo.add_argument(
        "--agents",
        type=_at_most(MAX_DEMO_AGENTS),
        default=6,
        help=f"worker processes, 1..{MAX_DEMO_AGENTS} (default 6)",
    )
    demo.add_argument(
        "--turns", type=_at_most(MAX_DEMO_TURNS), default=5, help=f"turns per agent, 1..{MAX_DEMO_TURNS} (default 5)"
    )
    demo.add_argument("--seats", type=_positive, default=3, help="policy: max active turns (default 3)")
    demo.add_argument("--starts", type=_positive, default=2, help="policy: max concurrent starts (default 2)")
    demo.add_argument("--start-interval-ms", type=_non_negative, default=0, help="policy: min start interval")
    demo.add_argument(
        "--cooldown-ms", type=_non_negative, default=4_000, help="policy: capacity cooldown (default 4000)"
    )
    demo.add_argument("--models", default="model-a,model-b", help="comma-separated models (default model-a,model-b)")
    demo.add_argument("--provider-min-ms", type=_non_negative, default=200, help="shortest provider call")
    demo.add_argument("--provider-max-ms", type=_non_negative, default=700, help="longest provider call")
    demo.add_argument("--no-capacity-fault", action="store_true", help="do not inject a provider capacity failure")
    demo.add_argument("--no-kill-fault", action="store_true", help="do not SIGKILL a worker mid-dispatch")
    demo.add_argument(
        "--progress",
        choices=("auto", "live", "lines", "none"),
        default="auto",
        help="live redrawn line on a terminal, periodic lines otherwise (default auto)",
    )
    demo.set_defaults(handler=cmd_demo)
    return parser
