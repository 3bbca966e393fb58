"""Worker processes for the multi-process and crash tests (no pytest here).

Run from the repository root: ``python -m tests.admission.workers <role> <database> ...``.
Every role opens its own :class:`AdmissionPlane` (so its own connector identity) and
speaks one JSON object per line on stdout. Roles:

``race <db> <index> <seconds> <policy-json> <seed>``
    Drives whole turns on wall-clock time until the deadline, then prints one report.
``race-v2 <db> <index> <seconds> <policy-v2-json> <seed> [no-capacity-failures] [until-revision]``
    The same with a whole policy v2 (``Policy.to_json``'s shape) and turns in random lanes, provider/model
    keys and sessions shared with every other worker; the report also names the policy revision the
    worker's plane sees at the end (it never reopens the plane). With ``until-revision`` a worker whose
    deadline passes before its plane sees a revision (``current_policy().revision >= 1``) goes on until it
    has seen one and admitted a request after it (at most :data:`UNTIL_REVISION_CAP_S` more).
``reaper-loop <db> <seconds> <interval-ms> <policy-json>``
    Calls ``reap_suspects`` with live ``/proc`` readers every interval, then prints totals.
``reaper <db> <policy-json>``
    For each stdin line ``{"now": N}`` runs one reaper pass and prints its summary.
``crash-at <db> <phase> <request-id> <policy-json>``
    Drives one turn to ``phase`` with a real child process group, prints ``ready``, then waits to be killed.
``queued <db> <request-id> <policy-json>``
    Enqueues one turn with a payload, prints ``ready``, then waits to be killed.
``wait <db> <request-id> <policy-json>``
    Enqueues one turn, prints ``ready``, waits for it with ``wait_for_admission``, completes it, prints ``done``.
``admit-request <db> <policy-json>``
    For each stdin line ``{"request_id": ..., "now": N}`` calls ``admit_request`` and prints the lease.
``dispatch <db> <hold-ms> <policy-json>``
    For each stdin line ``{"record": <seed-shaped dispatch record>}`` commits the dispatch intent and
    prints the result; with a hold, prints ``{"event": "in-tx"}`` inside the transaction and sleeps.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from admission_plane import (
    AdmissionDatabaseError,
    AdmissionError,
    AdmissionPlane,
    AdmittedLease,
    DispatchRecord,
    FaultInjection,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
)
from admission_plane.evidence import capture

ENCRYPTION_KEY = bytes([1]) * 32
CONTENT_KEY = bytes([2]) * 32
PROVIDER = "antigravity"
MODELS = ("model-a", "model-b", "model-c")
_STARTED = time.monotonic()
_RAW_MARKERS = ("sqlite", "database is locked", "psycopg", "deadlock detected", "could not serialize")


def wall_ms() -> int:
    """Wall-clock milliseconds: the ``now`` every worker passes."""
    return time.time_ns() // 1_000_000


def prompt_for(request_id: str) -> str:
    """The payload every worker seals for ``request_id`` (so any worker can check what it reads)."""
    return f"prompt for {request_id}"


def emit(value: dict[str, Any]) -> None:
    """Write one JSON line and flush it."""
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
    sys.stdout.flush()


def open_plane(database: str, policy_json: str, **options: Any) -> AdmissionPlane:
    """A plane on ``database`` with the tests' keys and the given policy tuple."""
    return AdmissionPlane(
        database,
        policy=Policy(*json.loads(policy_json)),
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
        **options,
    )


def is_raw_failure(error: BaseException) -> bool:
    """Whether an error a worker saw is a leak: not an :class:`AdmissionError`, a database error, or driver text."""
    if not isinstance(error, AdmissionError) or isinstance(error, AdmissionDatabaseError):
        return True
    message = str(error).lower()
    return any(marker in message for marker in _RAW_MARKERS)


def spawn_child_group(command: tuple[str, ...] = ("sleep", "600")) -> subprocess.Popen[bytes]:
    """A real dispatch child, leader of its own session and process group."""
    # No inherited pipes: a surviving child must not keep a killed worker's output open.
    return subprocess.Popen(
        list(command),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill_child_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group and reap the child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def dispatch_record(plane: AdmissionPlane, lease: AdmittedLease, child_pid: int) -> DispatchRecord:
    """The dispatch record of ``lease``: this plane's connector and the real child ``child_pid``."""
    return DispatchRecord.for_lease(lease, plane.owner_identity, capture(child_pid), prompt_channel="stdin")


@attrs.define
class Tally:
    """What one worker saw: counts of outcomes, allowed refusals, and raw failures (which fail the test)."""

    counts: Counter[str] = attrs.field(factory=Counter)
    refusals: Counter[str] = attrs.field(factory=Counter)
    raw: list[str] = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)

    _FAILED = object()

    def call(self, label: str, operation: Callable[[], Any]) -> Any:
        """Run one operation; a refusal returns :attr:`FAILED`, a raw failure is recorded too."""
        self.counts[f"op:{label}"] += 1
        try:
            return operation()
        except Exception as error:  # classifying every failure is the point
            text = f"{label}: {type(error).__name__}: {error}"
            if is_raw_failure(error):
                self.raw.append(text)
            else:
                self.refusals[text] += 1
            return self._FAILED

    def failed(self, value: Any) -> bool:
        return value is self._FAILED

    def report(self, **extra: Any) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "refusals": dict(self.refusals),
            "raw": self.raw[:20],
            "raw_count": len(self.raw),
            "violations": self.violations[:20],
            **extra,
        }


# --- race ------------------------------------------------------------------------------------------


def run_race(database: str, index: str, seconds: str, policy_json: str, seed: str) -> None:
    """Enqueue, admit, start, dispatch, activate and end turns against every other worker."""
    rng = random.Random(int(seed))
    tally = Tally()
    plane = open_plane(database, policy_json)
    owner = plane.owner_identity.owner_instance_id
    opened = time.monotonic()
    deadline = opened + float(seconds)
    mine: list[str] = []
    serial = 0
    try:
        while time.monotonic() < deadline:
            # Another worker's admit_next may have taken one of ours.
            mine = [r for r in mine if _still_queued(plane, r)]
            if len(mine) < 3:
                request_id = f"w{index}-r{serial}"
                serial += 1
                fields = turn_fields(request_id, f"agent-{index}-{serial % 2}", rng.choice(MODELS))
                if not tally.failed(tally.call("enqueue", lambda f=fields: plane.enqueue_with_payload(**f))):
                    mine.append(request_id)
            lease = _admit_one(plane, owner, mine, tally, rng)
            if tally.failed(lease) or lease is None:
                time.sleep(rng.uniform(0.001, 0.006))
                continue
            tally.counts["admitted"] += 1
            if lease.generation != 1:
                tally.violations.append(f"lease generation {lease.generation}")
            if lease.request_id in mine:
                mine.remove(lease.request_id)
            drive_turn(plane, lease, tally, rng)
        for request_id in mine:
            if not tally.failed(tally.call("cancel_queued", lambda r=request_id: plane.cancel_queued(r, wall_ms()))):
                tally.counts["cancelled_queued"] += 1
    finally:
        plane.close()
    emit(
        tally.report(
            role="race",
            index=int(index),
            owner=owner,
            timing=[round(t - _STARTED, 3) for t in (opened, deadline, time.monotonic())],
        )
    )


def turn_fields(request_id: str, agent_id: str, model: str) -> dict[str, Any]:
    """``enqueue_with_payload`` arguments for one turn, at wall-clock now, sealing :func:`prompt_for`."""
    now = wall_ms()
    return {
        "request_id": request_id,
        "session_id": "session-1",
        "agent_id": agent_id,
        "fingerprint": "fp",
        "provider": PROVIDER,
        "model": model,
        "now": now,
        "plaintext": prompt_for(request_id),
        "expires_at": now + 600_000,
    }


def _admit_one(plane: AdmissionPlane, owner: str, mine: list[str], tally: Tally, rng: random.Random) -> Any:
    """A quarter of the time wait briefly for one of ``mine`` (its admission starting it where it can, as the
    turn API's does), a quarter admit one by id (only if the rule would choose it), else the rule's choice."""
    roll = rng.random()
    if mine and roll < 0.5:
        target = rng.choice(mine)
        if roll < 0.25:
            return tally.call(
                "wait_for_admission", lambda: plane.wait_for_admission(target, owner, timeout_ms=20, start=True)
            )
        return tally.call("admit_request", lambda: plane.admit_request(target, wall_ms(), owner))
    return tally.call("admit_next", lambda: plane.admit_next(wall_ms(), owner))


def _still_queued(plane: AdmissionPlane, request_id: str) -> bool:
    stored = plane.get_request(request_id)
    return stored is not None and stored.state == "queued"


def drive_turn(
    plane: AdmissionPlane, lease: AdmittedLease, tally: Tally, rng: random.Random, *, capacity_failures: bool = True
) -> None:
    """Take one admitted lease to an end: abandoned, completed (maybe a capacity failure, unless
    ``capacity_failures`` is false) or a released recovery."""

    def abandon(label: str) -> None:
        outcome = rng.choice(("cancelled", "failed"))
        if not tally.failed(tally.call(label, lambda: plane.abandon_before_prompt(lease, wall_ms(), outcome))):
            tally.counts["abandoned"] += 1
        else:
            tally.violations.append(f"{label} refused")

    if lease.starting:  # its admission started it (``wait_for_admission(start=True)``)
        tally.counts["started_by_admission"] += 1
    else:
        for _attempt in range(50):
            started = tally.call("mark_starting", lambda: plane.mark_starting(lease, wall_ms()))
            if not tally.failed(started):
                break
            time.sleep(0.002)
        else:
            abandon("abandon_unstarted")
            return
    if rng.random() < 0.1:
        abandon("abandon_starting")
        return
    child = spawn_child_group(("sleep", "30"))
    try:
        result = tally.call(
            "commit_dispatch_intent", lambda: plane.commit_dispatch_intent(dispatch_record(plane, lease, child.pid))
        )
        if tally.failed(result) or not result.ok or result.idempotent:
            tally.violations.append(f"dispatch intent not committed: {result}")
            abandon("abandon_undispatched")
            return
        tally.counts["dispatch_intent"] += 1
        payload = tally.call("read_payload", lambda: plane.read_payload(lease.request_id, wall_ms()))
        if payload != prompt_for(lease.request_id):
            tally.violations.append("payload read back differs")
        if rng.random() < 0.05:
            abandon("abandon_dispatch_intent")
            return
        if tally.failed(tally.call("mark_active", lambda: plane.mark_active(lease, wall_ms()))):
            tally.violations.append("mark_active refused")
            return
        tally.counts["active"] += 1
        after = tally.call("read_payload_after_active", lambda: plane.read_payload(lease.request_id, wall_ms()))
        if not tally.failed(after):
            tally.violations.append("payload readable after active")
        time.sleep(rng.uniform(0.0, 0.02))
        tally.call("heartbeat", lambda: plane.heartbeat(lease, wall_ms()))
        fate = rng.random()
        if fate < 0.12:
            end_in_recovery(plane, lease, tally, child)
            return
        if fate < 0.35 and capacity_failures:
            completion = LiveTurnCompletion("failed", LiveTurnFailure("provider_capacity", http_status=503))
            label = "capacity_failed"
        elif fate < 0.45:
            completion = LiveTurnCompletion("cancelled")
            label = "cancelled_live"
        else:
            completion = LiveTurnCompletion("completed")
            label = "completed"
        ended = tally.call("complete_live_turn", lambda: plane.complete_live_turn(lease, wall_ms(), completion))
        if tally.failed(ended):
            tally.violations.append("complete_live_turn refused")
        else:
            tally.counts[label] += 1
    finally:
        kill_child_group(child)


def end_in_recovery(plane: AdmissionPlane, lease: AdmittedLease, tally: Tally, child: subprocess.Popen[bytes]) -> None:
    """Mark the turn ``recovery_required`` (seat held), prove the child gone, then release the seat."""
    if tally.failed(tally.call("mark_recovery", lambda: plane.mark_execution_recovery_required(lease, wall_ms()))):
        tally.violations.append("mark_execution_recovery_required refused")
        return
    kill_child_group(child)
    if tally.failed(tally.call("release_seat", lambda: plane.release_exited_recovery_seat(lease, wall_ms()))):
        tally.violations.append("release_exited_recovery_seat refused")
        return
    tally.counts["recovery_released"] += 1


# --- race with policy v2 --------------------------------------------------------------------------

#: The provider/model keys and the sessions (shared by every worker) of the policy v2 race.
V2_KEYS = (("p1", "m1"), ("p1", "m2"), ("p2", "m1"))
V2_SESSIONS = tuple(f"shared-session-{n}" for n in range(6))


#: How long ``race-v2 ... until-revision`` goes on past its deadline at most, waiting for a revision.
UNTIL_REVISION_CAP_S = 60.0


def run_race_v2(database: str, index: str, seconds: str, policy_json: str, seed: str, *options: str) -> None:
    """Enqueue turns in random lanes, keys and sessions, admit and drive them like :func:`run_race` (no turn
    ends in a capacity failure, which cools its key down, with ``no-capacity-failures``)."""
    capacity_failures = "no-capacity-failures" not in options
    until_revision = "until-revision" in options
    rng = random.Random(int(seed))
    tally = Tally()
    policy = Policy.from_json(policy_json)
    plane = AdmissionPlane(database, policy=policy, encryption_key=ENCRYPTION_KEY, content_fingerprint_key=CONTENT_KEY)
    owner = plane.owner_identity.owner_instance_id
    deadline = time.monotonic() + float(seconds)
    mine: list[str] = []
    serial = 0
    admitted_at_revision: int | None = None  # the admissions counted when the plane first saw a revision, late

    def going_on() -> bool:
        """Before the deadline; past it (``until-revision``), until a revision is seen and one more admission made."""
        nonlocal admitted_at_revision
        late = time.monotonic() - deadline
        if late < 0:
            return True
        if not until_revision or late >= UNTIL_REVISION_CAP_S:
            return False
        if admitted_at_revision is None:
            if plane.current_policy().revision >= 1:
                admitted_at_revision = tally.counts["admitted"]
            return True
        return tally.counts["admitted"] == admitted_at_revision

    try:
        while going_on():
            mine = [r for r in mine if _still_queued(plane, r)]
            if len(mine) < 3:
                request_id = f"w{index}-r{serial}"
                serial += 1
                provider, model = rng.choice(V2_KEYS)
                fields = {
                    **turn_fields(request_id, f"agent-{index}-{serial % 2}", model),
                    "provider": provider,
                    "session_id": rng.choice(V2_SESSIONS),
                    "lane": rng.choice([lane.name for lane in policy.lanes]),
                }
                if not tally.failed(tally.call("enqueue", lambda f=fields: plane.enqueue_with_payload(**f))):
                    mine.append(request_id)
            lease = _admit_one(plane, owner, mine, tally, rng)
            if tally.failed(lease) or lease is None:
                time.sleep(rng.uniform(0.001, 0.006))
                continue
            tally.counts["admitted"] += 1
            if lease.request_id in mine:
                mine.remove(lease.request_id)
            drive_turn(plane, lease, tally, rng, capacity_failures=capacity_failures)
        for request_id in mine:
            tally.call("cancel_queued", lambda r=request_id: plane.cancel_queued(r, wall_ms()))
        revision = plane.current_policy().revision
    finally:
        plane.close()
    emit(tally.report(role="race-v2", index=int(index), owner=owner, revision=revision))


# --- reapers ---------------------------------------------------------------------------------------


def run_reaper_loop(database: str, seconds: str, interval_ms: str, policy_json: str) -> None:
    """Reap with live evidence on an interval until the deadline; print the summed summaries."""
    tally = Tally()
    totals: Counter[str] = Counter()
    plane = open_plane(database, policy_json)
    deadline = time.monotonic() + float(seconds)
    try:
        while time.monotonic() < deadline:
            summary = tally.call("reap_suspects", lambda: plane.reap_suspects(wall_ms()))
            if not tally.failed(summary):
                totals.update(attrs.asdict(summary))
                totals["passes"] += 1
            time.sleep(int(interval_ms) / 1000)
    finally:
        plane.close()
    emit(tally.report(role="reaper-loop", totals=dict(totals)))


def run_reaper(database: str, policy_json: str) -> None:
    """One reaper pass per stdin command ``{"now": N}``; prints the summary (or the error)."""
    plane = open_plane(database, policy_json)
    try:
        emit({"event": "ready", "pid": os.getpid()})
        for line in sys.stdin:
            command = json.loads(line)
            try:
                emit({"summary": attrs.asdict(plane.reap_suspects(command["now"]))})
            except Exception as error:  # reported to the test, which fails on it
                emit({"error": f"{type(error).__name__}: {error}"})
    finally:
        plane.close()


# --- crash points ----------------------------------------------------------------------------------

_CRASH_PHASES = ("admitted", "starting", "dispatch_intent", "active")


def run_crash_at(database: str, phase: str, request_id: str, policy_json: str) -> None:
    """Drive one turn to ``phase`` with a live child group (``sh`` plus a background ``sleep``); wait to be killed."""
    if phase not in _CRASH_PHASES:
        raise SystemExit(f"unknown phase {phase!r}")
    plane = open_plane(database, policy_json)
    owner = plane.owner_identity.owner_instance_id
    plane.enqueue_with_payload(**turn_fields(request_id, "agent-crash", MODELS[0]))
    lease = plane.admit_request(request_id, wall_ms(), owner)
    if lease is None:
        raise SystemExit("crash worker could not admit its request")
    # The group outlives its leader: killing only the recorded child leaves the background sleep behind.
    child = spawn_child_group(("sh", "-c", "sleep 600 & wait"))
    if phase != "admitted":
        plane.mark_starting(lease, wall_ms())
    if phase in ("dispatch_intent", "active"):
        result = plane.commit_dispatch_intent(dispatch_record(plane, lease, child.pid))
        if not result.ok:
            raise SystemExit(f"dispatch intent failed: {result}")
    if phase == "active":
        plane.read_payload(request_id, wall_ms())
        plane.mark_active(lease, wall_ms())
    emit(
        {
            "event": "ready",
            "request_id": request_id,
            "lease_id": lease.lease_id,
            "generation": lease.generation,
            "owner_instance_id": owner,
            "child_pid": child.pid,
            "pid": os.getpid(),
        }
    )
    while True:
        time.sleep(60)


def run_queued(database: str, request_id: str, policy_json: str) -> None:
    """Enqueue one turn bound to this process as its queued owner; wait to be killed."""
    plane = open_plane(database, policy_json)
    plane.enqueue_with_payload(**turn_fields(request_id, "agent-queued", MODELS[0]))
    emit(
        {
            "event": "ready",
            "request_id": request_id,
            "owner_instance_id": plane.owner_identity.owner_instance_id,
            "pid": os.getpid(),
        }
    )
    while True:
        time.sleep(60)


def run_wait(database: str, request_id: str, policy_json: str) -> None:
    """Enqueue one turn, print ``ready``, wait for its admission, run it to completion, print the outcome."""
    plane = open_plane(database, policy_json)
    try:
        plane.enqueue_with_payload(**turn_fields(request_id, f"agent-{request_id}", MODELS[0]))
        emit({"event": "ready", "request_id": request_id})
        lease = plane.wait_for_admission(request_id, plane.owner_identity.owner_instance_id, timeout_ms=60_000)
        if lease is not None:
            plane.mark_starting(lease, wall_ms())
            plane.mark_dispatch_intent(lease, wall_ms())
            plane.mark_active(lease, wall_ms())
            plane.complete_live_turn(lease, wall_ms(), LiveTurnCompletion("completed"))
        emit({"event": "done", "request_id": request_id, "admitted": lease is not None})
    finally:
        plane.close()


# --- contention ------------------------------------------------------------------------------------


def run_admit_request(database: str, policy_json: str) -> None:
    """``admit_request`` per stdin command; prints the lease (or ``null``) or the classified error."""
    plane = open_plane(database, policy_json)
    owner = plane.owner_identity.owner_instance_id
    try:
        emit({"event": "ready", "owner_instance_id": owner})
        for line in sys.stdin:
            command = json.loads(line)
            try:
                lease = plane.admit_request(command["request_id"], command["now"], owner)
            except Exception as error:  # reported to the test, which classifies it
                emit({"error": f"{type(error).__name__}: {error}", "raw": is_raw_failure(error)})
                continue
            emit({"lease": None if lease is None else attrs.asdict(lease)})
    finally:
        plane.close()


def run_dispatch(database: str, hold_ms: str, policy_json: str) -> None:
    """``commit_dispatch_intent`` per stdin record; optionally holding the write lock inside the transaction."""
    hold = int(hold_ms) / 1000

    def hold_the_lock() -> None:
        emit({"event": "in-tx"})
        time.sleep(hold)

    faults = FaultInjection(after_process_identity_persisted=hold_the_lock) if hold > 0 else None
    plane = open_plane(database, policy_json, fault_injection=faults)
    try:
        emit({"event": "ready"})
        for line in sys.stdin:
            command = json.loads(line)
            try:
                result = plane.commit_dispatch_intent(command["record"])
            except Exception as error:  # commit_dispatch_intent must never raise
                emit({"error": f"{type(error).__name__}: {error}"})
                continue
            emit({"result": attrs.asdict(result)})
    finally:
        plane.close()


# --- test-side helpers (used by the tests to run and clean up processes) ---------------------------

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PR_SET_CHILD_SUBREAPER = 36


class WorkerProcess:
    """A worker subprocess speaking JSON lines; a reader thread makes timed reads possible."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.admission.workers", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.popen.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.popen.stderr, self._stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: Callable[[Any], None]) -> None:
        for line in stream:
            sink(line)
        sink(None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stderr(self) -> str:
        return "".join(line for line in self._stderr if line is not None)

    def send(self, value: dict[str, Any]) -> None:
        """Write one JSON command line."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(value) + "\n")
        self.popen.stdin.flush()

    def read(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next JSON line; raises ``RuntimeError`` (with the worker's stderr) on timeout or exit."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"worker {self.args[0]} sent nothing in {timeout} s; stderr:\n{self.stderr}") from None
        if line is None:
            self.popen.wait(timeout=10)
            raise RuntimeError(
                f"worker {self.args[0]} exited {self.popen.returncode} without output; stderr:\n{self.stderr}"
            )
        return json.loads(line)

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """Close stdin, wait for exit 0 and return the last JSON line."""
        assert self.popen.stdin is not None
        self.popen.stdin.close()
        last = None
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"worker {self.args[0]} did not finish; stderr:\n{self.stderr}") from None
            if line is None:
                break
            last = line
        code = self.popen.wait(timeout=10)
        if code != 0 or last is None:
            raise RuntimeError(f"worker {self.args[0]} exited {code}; stderr:\n{self.stderr}")
        return json.loads(last)

    def kill(self) -> None:
        """SIGKILL the worker and reap it (idempotent); the reader threads end at end of file."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()


def set_child_subreaper(enabled: bool) -> None:
    """Make this process adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    A killed worker's dispatch child is then reparented to us, so we can reap it when we
    kill it; otherwise it would become a zombie of an init that may never reap it, and a
    zombie is (conservatively) still alive to the reaper.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """Every pid whose process group is ``pgid`` (zombies included)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def reap_until_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Reap ``pids`` where they are our children (or adopted) and wait until ``/proc`` no longer lists them."""
    deadline = time.monotonic() + timeout
    remaining = set(pids)
    while remaining:
        for pid in list(remaining):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not os.path.exists(f"/proc/{pid}"):
                remaining.discard(pid)
        if not remaining:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes still present: {sorted(remaining)}")
        time.sleep(0.01)


def kill_pid_and_wait(pid: int) -> None:
    """SIGKILL one process and wait until it is gone (reaped)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    reap_until_gone([pid])


def kill_group_and_wait(pgid: int) -> None:
    """SIGKILL every member of process group ``pgid`` and wait until none is left."""
    members = group_members(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    reap_until_gone(members)
    reap_until_gone(group_members(pgid))


ROLES: dict[str, Callable[..., None]] = {
    "race": run_race,
    "race-v2": run_race_v2,
    "reaper-loop": run_reaper_loop,
    "reaper": run_reaper,
    "crash-at": run_crash_at,
    "queued": run_queued,
    "wait": run_wait,
    "admit-request": run_admit_request,
    "dispatch": run_dispatch,
}


def main(argv: list[str]) -> None:
    """Dispatch to a role."""
    if not argv or argv[0] not in ROLES:
        raise SystemExit(f"usage: workers.py {{{','.join(ROLES)}}} ...")
    ROLES[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
