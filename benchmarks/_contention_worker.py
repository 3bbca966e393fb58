"""One connector process of the contention benchmark (``python -m benchmarks._contention_worker``).

It opens the plane, prints ``ready``, waits for ``go`` on standard input, then for a
fixed time enqueues its own request (admitted in the same transaction where it can, as the
turn API does: ``admit_as``; not with ``--enqueue-only``), waits for it with
``wait_for_admission(start=True)`` when it was not (its admission starts the lease where it
can, as the turn API's does; not with ``--start-apart``; polling
with back-off from ``--poll-ms`` to ``--max-poll-ms``, default 4 ms), and
drives it to completion, again and again. After the deadline it finishes the turn in
flight (so no seat stays held) and prints one JSON line: its turns within the window, all
its turns, and its errors by kind. Errors are counted and the operation retried; a
dispatch intent that is not committed is abandoned (no prompt was written).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from admission_plane import (
    AdmissionBusyError,
    AdmissionDatabaseError,
    AdmissionError,
    AdmissionStateError,
    LiveTurnCompletion,
    Policy,
)
from admission_plane.evidence import capture
from benchmarks._support import dispatch_record, request_fields

T = TypeVar("T")
#: Error kinds that are raw driver errors (or database errors) reaching the connector.
RAW_KINDS = ("busy:", "database:", "sqlite3:", "psycopg:")


def _driver_errors() -> tuple[type[BaseException], ...]:
    """The DB-API error bases a connector might see raw: sqlite3's, and psycopg's when installed."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


DRIVER_ERRORS = _driver_errors()
COMPLETED = LiveTurnCompletion("completed")


def _switches_since(before: resource.struct_rusage) -> dict[str, int]:
    """This process's context switches since ``before``: voluntary (it blocked: a round trip, a lock, a sleep)
    and involuntary (the kernel took the CPU from it while it could have run on)."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "voluntary_switches": now.ru_nvcsw - before.ru_nvcsw,
        "involuntary_switches": now.ru_nivcsw - before.ru_nivcsw,
    }


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _kind(error: BaseException) -> str:
    if isinstance(error, AdmissionBusyError | AdmissionDatabaseError):
        cause = error.__cause__
        original = getattr(cause, "orig", cause)
        name = getattr(original, "sqlite_errorname", None) or getattr(original, "sqlstate", None)
        return f"{'busy' if isinstance(error, AdmissionBusyError) else 'database'}:{name or type(original).__name__}"
    if isinstance(error, sqlite3.Error):
        return f"sqlite3:{getattr(error, 'sqlite_errorname', type(error).__name__)}"
    if isinstance(error, DRIVER_ERRORS):
        return f"psycopg:{getattr(error, 'sqlstate', None) or type(error).__name__}"
    if isinstance(error, AdmissionStateError):
        return f"state:{error}"
    return f"other:{type(error).__name__}:{error}"


class GateTimer:
    """Times each SQLite writing unit's hold of the writer gate (wall and the holding thread's CPU) and its
    ``COMMIT``, by wrapping ``admission_plane.store.unit_of_work`` in this process only (a few clock reads
    per unit)."""

    def __init__(self) -> None:
        self.enabled = False
        self.held_s = 0.0
        self.units = 0
        self.commits: list[float] = []
        self._since: dict[int, float] = {}
        self._cpu_since: dict[int, float] = {}
        self.held_cpu_s = 0.0

    def install(self) -> None:
        from admission_plane.store import unit_of_work

        gate, unit = unit_of_work._WriterGate, unit_of_work.UnitOfWork
        enter, leave, commit = gate.enter.__func__, gate.leave, unit.commit  # type: ignore[attr-defined]
        timer = self

        def timed_enter(cls: Any, engine: Any) -> Any:
            held = enter(cls, engine)
            if held is not None and timer.enabled:
                timer._since[id(held)] = time.perf_counter()
                timer._cpu_since[id(held)] = time.thread_time()
            return held

        def timed_leave(held: Any) -> None:
            since = timer._since.pop(id(held), None)
            cpu_since = timer._cpu_since.pop(id(held), None)
            leave(held)
            if since is not None:
                timer.held_s += time.perf_counter() - since
                timer.units += 1
            if cpu_since is not None:
                timer.held_cpu_s += time.thread_time() - cpu_since

        def timed_commit(uow: Any) -> None:
            start = time.perf_counter()
            commit(uow)
            if uow._gate is not None and timer.enabled:
                timer.commits.append(time.perf_counter() - start)

        gate.enter = classmethod(timed_enter)  # type: ignore[method-assign, assignment]
        gate.leave = timed_leave  # type: ignore[method-assign]
        unit.commit = timed_commit  # type: ignore[method-assign]

    def figures(self) -> dict[str, float | int]:
        commits = sorted(self.commits)
        return {
            "gate_held_s": self.held_s,
            "gate_held_cpu_s": self.held_cpu_s,
            "gate_units": self.units,
            "commit_s": sum(commits),
            "commit_median_us": commits[len(commits) // 2] * 1e6 if commits else 0.0,
        }


GATE = GateTimer()


class Connector:
    """The turn loop of one process."""

    def __init__(self, args: argparse.Namespace) -> None:
        from admission_plane import AdmissionPlane
        from benchmarks._support import CONTENT_KEY, ENCRYPTION_KEY

        policy = Policy(*json.loads(args.policy))
        self.plane = AdmissionPlane(
            args.database,
            policy=policy,
            encryption_key=ENCRYPTION_KEY,
            content_fingerprint_key=CONTENT_KEY,
            # pg_scale simulates several hosts on one database: worker i is host ``i mod --hosts``.
            host_id=f"simulated-host-{args.index % args.hosts}" if args.hosts else None,
        )
        self.index, self.hold_s, self.poll_s = args.index, args.hold_ms / 1000, args.poll_ms / 1000
        self.max_poll_ms = max(args.max_poll_ms, args.poll_ms)
        self.owner = self.plane.owner_identity.owner_instance_id
        self.admit_with_enqueue = not args.enqueue_only
        self.start_with_admission = not args.start_apart
        self.child = capture(os.getpid())
        self.errors: Counter[str] = Counter()
        self.turns = 0
        self.abandoned = 0
        self.polls = 0

    def _retry(self, call: Callable[[], T]) -> T:
        """Run ``call``; on a counted error, try again (each operation is one atomic transaction)."""
        while True:
            try:
                return call()
            except (AdmissionError, *DRIVER_ERRORS) as error:
                self.errors[_kind(error)] += 1
                if isinstance(error, AdmissionStateError) and "start interval" not in str(error):
                    raise
                time.sleep(self.poll_s)

    def _looked(self, _now: int) -> None:
        self.polls += 1  # a look that did not admit: the waiting cost, counted alike with any doorbell

    def turn(self) -> bool:
        """One full turn of this process's own request; ``False`` if it had to be abandoned."""
        plane = self.plane
        self.turns += 1
        request_id = f"p{self.index}-{self.turns}-{time.monotonic_ns()}"
        enqueued = self._retry(
            lambda: plane.enqueue_with_payload(
                **request_fields(
                    request_id, _wall_ms(), agent_id=f"agent-{self.index}", session_id=f"session-{self.index}"
                ),
                admit_as=self.owner if self.admit_with_enqueue else None,  # as the turn API does
            )
        )
        lease = enqueued.admitted or self._retry(
            lambda: plane.wait_for_admission(
                request_id,
                self.owner,
                initial_delay_ms=self.poll_s * 1000,
                max_delay_ms=self.max_poll_ms,
                on_wait=self._looked,
                start=self.start_with_admission,  # as the turn API does
            )
        )
        assert lease is not None, "a queued request without a timeout is always admitted eventually"
        # ``now`` is read before the write lock: a start committed meanwhile by another
        # process may carry a later ``now``; that refusal is counted and retried.
        if not lease.starting:  # a waiter's admission on SQLite starts the lease in its own transaction
            self._retry(lambda: plane.mark_starting(lease, _wall_ms()))
        result = plane.commit_dispatch_intent(dispatch_record(plane, lease, self.child))
        if not result.ok:
            self.errors[f"dispatch:{result.reason}"] += 1
            self._retry(lambda: plane.abandon_before_prompt(lease, _wall_ms(), "failed"))
            self.abandoned += 1
            return False
        self._retry(lambda: plane.mark_active(lease, _wall_ms()))
        if self.hold_s:
            time.sleep(self.hold_s)
        self._retry(lambda: plane.complete_live_turn(lease, _wall_ms(), COMPLETED))
        return True

    def warm_up(self) -> None:
        """Compile every statement and run one turn, so the timed window sees a warm process."""
        from admission_plane.store.statements import every_statement

        dialect = self.plane.engine.dialect
        for statement in every_statement():
            if statement.supports(dialect):
                statement.compiled(dialect)
        self.turn()
        self.errors.clear()
        self.polls = 0

    def run(self, seconds: float) -> dict[str, Any]:
        """Turns until ``seconds`` have passed, then the turn in flight; the figures of the run."""
        GATE.enabled = True
        in_window = 0
        cpu_start = time.process_time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        deadline = start + seconds
        while time.monotonic() < deadline:
            completed = self.turn()
            if completed and time.monotonic() <= deadline:
                in_window += 1
        return {
            "index": self.index,
            "turns_in_window": in_window,
            "turns": self.turns,
            "abandoned": self.abandoned,
            "admission_polls": self.polls,
            "elapsed_s": time.monotonic() - start,
            "cpu_s": time.process_time() - cpu_start,
            **_switches_since(usage),
            "errors": dict(self.errors),
            **GATE.figures(),
        }


def main(argv: list[str] | None = None) -> int:
    """Open, report ready, wait for ``go``, run, report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True, help="SQLite file path or database URL (postgresql+psycopg://)")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--hold-ms", type=float, default=0)
    parser.add_argument("--poll-ms", type=float, default=1)
    parser.add_argument("--max-poll-ms", type=float, default=4, help="the back-off ceiling")
    parser.add_argument("--policy", required=True, help="JSON list: the five policy integers")
    parser.add_argument("--hosts", type=int, default=0, help="simulated hosts (0: this machine's host id)")
    parser.add_argument(
        "--enqueue-only",
        action="store_true",
        help="enqueue without admit_as (the turn API admits with the enqueue where it can; this measures without)",
    )
    parser.add_argument(
        "--start-apart",
        action="store_true",
        help="a waiter starts its lease in a unit of its own (the turn API has its admission start it where it can)",
    )
    args = parser.parse_args(argv)
    GATE.install()
    connector = Connector(args)
    try:
        connector.warm_up()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        print(json.dumps(connector.run(args.seconds)), flush=True)
    finally:
        connector.plane.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
