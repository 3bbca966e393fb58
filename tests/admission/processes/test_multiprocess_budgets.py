"""Budgets under contention: eight OS processes on one database (an SQLite file or PostgreSQL) drive random turn
lifecycles under request and token budgets over short and long sliding windows, and no admission ever finds a window
it would overflow. Judged by replaying the journal, whose correlations the test maps back to requests with the
content key, against what each worker logged (to its own file) of every request: its estimate, the usage it
reported and how its turn ended.

Why a replay in ``event_seq`` order sees exactly what each admission saw, on both dialects (the argument of
``journal_replay``'s docstring, carried over to the budget events): the budget events are written by the same units
as the request events they belong to. ``budget_reserved`` is written by the admission unit, beside its
``request_admitted``; on PostgreSQL an admission unit holds the gate exclusively, so every event committed before it
has a lower number and every event committed after it a higher one, and no writer is in flight while it reads the
windows. ``budget_settled`` is written by the lease unit that frees the seat, beside the seat-freeing event; lease
units may commit side by side in another order than their numbers, but never beside an admission, and each settles
only its own request's charge (one charge row, locked by its lease row), so whatever order the settlements between two
admissions committed in, the charges the next admission reads are exactly those the events numbered below it leave.
(Enqueues, which take the gate shared too, write no budget event; the estimate an admission reserves is its request's,
committed with it before the admission could see the request.) So the windows replayed at each ``request_admitted``
are the windows that admission counted. On SQLite writers are serialised and ``event_seq`` order is commit order
outright.

This file is also the worker: ``python test_multiprocess_budgets.py <db> <index> <seconds> <policy-json> <seed>
<log-file>`` (see :func:`run_worker`); the test starts eight of them.
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from dbutil import query, scalar
from journal_replay import read_journal, replay
from planes import CONTENT_KEY, ENCRYPTION_KEY
from workers import REPO_ROOT, Tally, WorkerProcess, wall_ms

from admission_plane import (
    AdmissionPlane,
    AdmittedLease,
    Budget,
    LiveTurnCompletion,
    LiveTurnFailure,
    Policy,
    Usage,
)
from admission_plane.states import EventKind

pytestmark = pytest.mark.slow

WORKERS = 8
#: How long each worker drives turns (s).
RUN_SECONDS = 6.0
#: A worker goes on past ``RUN_SECONDS`` (up to this long in all) until the whole-run windows are spent: on a
#: loaded machine eight workers may not fit enough turns into ``RUN_SECONDS`` to spend them (seen once: 7 of 8).
MAX_RUN_SECONDS = 30.0
#: Longer than any run: the "whole run" windows (and no settled charge is pruned while the test looks).
WHOLE_RUN_MS = 600_000
KEY_SHORT = Budget("p1", "m1", window_ms=400, max_requests=2, max_tokens=1_500)
KEY_LONG = Budget("p1", "m1", window_ms=WHOLE_RUN_MS, max_requests=8, max_tokens=60_000)
PROVIDER_SHORT = Budget("p1", None, window_ms=300, max_requests=3, max_tokens=2_500)
#: Room for about twice the tokens p1/m1 spends before :data:`KEY_LONG` is full (at most 2 of its requests every
#: 400 ms, about a third of them refunded): with half of it (12 000), p1/m2 sometimes spent the provider's tokens
#: first, and p1/m1 stopped at 7 of its 8 requests, its head no longer fitting (a fresh-clone ``make test``).
PROVIDER_LONG = Budget("p1", None, window_ms=WHOLE_RUN_MS, max_requests=200, max_tokens=24_000)
BUDGETS = (KEY_SHORT, KEY_LONG, PROVIDER_SHORT, PROVIDER_LONG)
#: Seats and starts never bind (eight workers hold at most eight leases): the budgets do.
RACE_POLICY = Policy(8, 8, 0, 1_800_000, 200, budgets=BUDGETS)
#: Two budgeted keys (p1/m1 under every budget, p1/m2 under the provider's) and one without a budget.
KEYS = (("p1", "m1"), ("p1", "m2"), ("p2", "m1"))
MAX_ESTIMATE = 1_200

#: How a worker drives an admitted turn, and how its reservation must settle (if its key has a budget). Each worker
#: drives them in a random order of its own, over and over, so every one is driven many times in a run.
FATES: dict[str, str] = {
    "abandon_admitted": "refunded",
    "abandon_starting": "refunded",
    "operator_starting": "refunded",
    "abandon_dispatch_intent": "refunded",
    "usage_below": "reconciled",
    "usage_above": "reconciled",
    "failed_usage": "reconciled",
    "cancelled_usage": "reconciled",
    "no_usage": "charged",
    "failed": "charged",
    "recovery_released": "retained",
    "operator_active": "retained",
}
#: The seat-freeing events, and the settlements each may journal.
SEAT_FREEING = {
    EventKind.REQUEST_RELEASED: {"reconciled", "charged"},
    EventKind.REQUEST_ABANDONED: {"refunded"},
    EventKind.LEASE_OWNER_DEAD: {"refunded"},
    EventKind.REQUEST_RECOVERY_SEAT_RELEASED: {"retained"},
    EventKind.OPERATOR_SEAT_RELEASED: {"refunded", "retained"},
}
BUDGET_KINDS = frozenset(
    {EventKind.BUDGET_RESERVED, EventKind.BUDGET_SETTLED, EventKind.BUDGET_USAGE_RECORDED, EventKind.BUDGET_CORRECTED}
)


# --- the worker (runs in its own process) -------------------------------------------------------------


def run_worker(database: str, index: str, seconds: str, policy_json: str, seed: str, log_file: str) -> None:
    """Keep one request of each key queued, admit (one of ours by id, or the rule's choice), drive every admitted turn
    to a random end; log each request's estimate at enqueue and its usage and fate at its end, one JSON line each.
    Run for ``seconds``, then on until the whole-run windows are spent (:class:`Spent`), up to
    :data:`MAX_RUN_SECONDS`."""
    rng = random.Random(int(seed))
    fates = list(FATES)
    rng.shuffle(fates)
    tally = Tally()
    plane = AdmissionPlane(
        database,
        policy=Policy.from_json(policy_json),
        encryption_key=ENCRYPTION_KEY,
        content_fingerprint_key=CONTENT_KEY,
    )
    owner = plane.owner_identity.owner_instance_id
    # Start together: eight interpreters importing on two busy cores take a while, and the race needs all eight.
    sys.stdout.write(json.dumps({"event": "ready"}) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()
    begun = time.monotonic()
    deadline, cap = begun + float(seconds), begun + max(float(seconds), MAX_RUN_SECONDS)
    spent = Spent(plane)
    queued: dict[tuple[str, str], str] = {}
    serial = 0
    with open(log_file, "w") as log:

        def write(**record: Any) -> None:
            log.write(json.dumps(record, sort_keys=True) + "\n")
            log.flush()

        try:
            while time.monotonic() < deadline or (time.monotonic() < cap and not spent()):
                queued = {key: r for key, r in queued.items() if _still_queued(plane, r)}
                for provider, model in KEYS:
                    if (provider, model) in queued:
                        continue
                    request_id = f"w{index}-r{serial}"
                    serial += 1
                    estimate = estimate_of(request_id)
                    now = wall_ms()
                    fields = {
                        "request_id": request_id,
                        "session_id": f"session-{index}",
                        "agent_id": f"agent-{index}-{serial % 3}",
                        "fingerprint": "fp",
                        "provider": provider,
                        "model": model,
                        "now": now,
                        "plaintext": f"prompt for {request_id}",
                        "expires_at": now + 600_000,
                        "estimated_tokens": estimate,
                    }
                    if not tally.failed(tally.call("enqueue", lambda f=fields: plane.enqueue_with_payload(**f))):
                        queued[(provider, model)] = request_id
                        write(event="enqueued", request_id=request_id, key=[provider, model], estimate=estimate)
                if queued and rng.random() < 0.5:
                    target = rng.choice(list(queued.values()))
                    lease = tally.call("admit_request", lambda t=target: plane.admit_request(t, wall_ms(), owner))
                else:
                    lease = tally.call("admit_next", lambda: plane.admit_next(wall_ms(), owner))
                if tally.failed(lease) or lease is None:
                    time.sleep(rng.uniform(0.001, 0.006))
                    continue
                tally.counts["admitted"] += 1
                if _budgeted(plane, lease.request_id):
                    # The budgets admit few turns (about 40 in all): worker i's k-th takes the fate at i + 8k of
                    # FATES, so two budgeted turns a worker already drive every fate, every settlement with them.
                    fate = list(FATES)[(int(index) + WORKERS * tally.counts["budgeted"]) % len(FATES)]
                    tally.counts["budgeted"] += 1
                else:
                    fate = fates[tally.counts["admitted"] % len(fates)]
                usage = _drive(plane, lease, fate, tally, rng)
                tally.counts[fate] += 1
                write(event="ended", request_id=lease.request_id, fate=fate, usage=usage)
            for request_id in queued.values():
                tally.call("cancel_queued", lambda r=request_id: plane.cancel_queued(r, wall_ms()))
        finally:
            plane.close()
    sys.stdout.write(json.dumps(tally.report(index=int(index)), sort_keys=True) + "\n")
    sys.stdout.flush()


def estimate_of(request_id: str) -> int | None:
    """The request's random estimate, drawn from its id (so whichever worker drives it knows it): none, zero, or up
    to :data:`MAX_ESTIMATE` tokens (every window of a key can hold it)."""
    rng = random.Random(f"estimate of {request_id}")
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.2:
        return 0
    return rng.randint(1, MAX_ESTIMATE)


class Spent:
    """Whether the whole-run windows are spent as the test requires (:data:`KEY_LONG` at its request limit,
    :data:`PROVIDER_LONG` within one estimate of its token limit), asked of ``budget_status`` at most every
    0.2 s. Only when to stop: the test checks the same by journal replay."""

    def __init__(self, plane: AdmissionPlane) -> None:
        self.plane, self.asked, self.answer = plane, float("-inf"), False

    def __call__(self) -> bool:
        if not self.answer and time.monotonic() - self.asked >= 0.2:
            self.asked = time.monotonic()
            windows = {(w.provider, w.model, w.window_ms): w for w in self.plane.budget_status(now=wall_ms())}
            key = windows[(KEY_LONG.provider, KEY_LONG.model, KEY_LONG.window_ms)]
            provider = windows[(PROVIDER_LONG.provider, PROVIDER_LONG.model, PROVIDER_LONG.window_ms)]
            self.answer = (
                key.requests >= KEY_LONG.max_requests
                and provider.reserved_tokens + provider.used_tokens > (PROVIDER_LONG.max_tokens or 0) - MAX_ESTIMATE
            )
        return self.answer


def _budgeted(plane: AdmissionPlane, request_id: str) -> bool:
    stored = plane.get_request(request_id)
    return stored is not None and any(budget.covers(stored.provider, stored.model) for budget in BUDGETS)


def _still_queued(plane: AdmissionPlane, request_id: str) -> bool:
    stored = plane.get_request(request_id)
    return stored is not None and stored.state == "queued"


def _drive(plane: AdmissionPlane, lease: AdmittedLease, fate: str, tally: Tally, rng: random.Random) -> int | None:
    """Take one admitted lease to the end ``fate`` names; the tokens the turn reported (``None``: none)."""

    def step(label: str, operation: Callable[[], Any]) -> None:
        if tally.failed(tally.call(label, operation)):
            tally.violations.append(f"{label} refused ({fate})")

    def abandon() -> None:
        outcome = rng.choice(("cancelled", "failed"))
        step("abandon_before_prompt", lambda: plane.abandon_before_prompt(lease, wall_ms(), outcome))

    if fate == "abandon_admitted":
        abandon()
        return None
    step("mark_starting", lambda: plane.mark_starting(lease, wall_ms()))
    if fate == "abandon_starting":
        abandon()
        return None
    if fate == "operator_starting":
        step("release_lease", lambda: plane.release_lease(lease.lease_id, wall_ms()))
        return None
    step("mark_dispatch_intent", lambda: plane.mark_dispatch_intent(lease, wall_ms()))
    if fate == "abandon_dispatch_intent":
        abandon()
        return None
    step("mark_active", lambda: plane.mark_active(lease, wall_ms()))
    time.sleep(rng.uniform(0.0, 0.015))
    if fate == "recovery_released":
        step("mark_recovery", lambda: plane.mark_execution_recovery_required(lease, wall_ms()))
        step("release_seat", lambda: plane.release_exited_recovery_seat(lease, wall_ms()))
        return None
    if fate == "operator_active":
        step("release_lease", lambda: plane.release_lease(lease.lease_id, wall_ms()))
        return None
    estimate = estimate_of(lease.request_id) or 0
    tokens: int | None = None
    if fate in ("usage_below", "failed_usage", "cancelled_usage"):
        tokens = rng.randint(0, estimate)
    elif fate == "usage_above":
        tokens = estimate + rng.randint(1, 800)
    usage = None
    if tokens is not None:
        given = rng.randint(0, tokens)
        usage = Usage(input_tokens=given, output_tokens=tokens - given)
    if fate in ("failed", "failed_usage"):
        completion = LiveTurnCompletion("failed", LiveTurnFailure("timeout"), usage=usage)
    elif fate == "cancelled_usage":
        completion = LiveTurnCompletion("cancelled", usage=usage)
    else:
        completion = LiveTurnCompletion("completed", usage=usage)
    step("complete_live_turn", lambda: plane.complete_live_turn(lease, wall_ms(), completion))
    return tokens


# --- the test side ---------------------------------------------------------------------------------------


class BudgetWorker(WorkerProcess):
    """A :class:`WorkerProcess` running this file's :func:`run_worker` instead of a ``workers.py`` role."""

    def __init__(self, *args: str) -> None:
        self.args = ("budget-race", *args)
        path = os.pathsep.join([REPO_ROOT, str(Path(__file__).resolve().parent.parent)])
        self.popen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.popen.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.popen.stderr, self._stderr.append), daemon=True).start()


@pytest.fixture
def budget_workers() -> Iterator[list[BudgetWorker]]:
    """The workers a test starts; every one still running is killed when the test ends."""
    started: list[BudgetWorker] = []
    yield started
    for worker in started:
        worker.kill()


@attrs.define
class Turn:
    """One request as the workers logged it."""

    key: tuple[str, str]
    estimate: int | None
    fate: str | None = None
    usage: int | None = None

    @property
    def tokens(self) -> int:
        """What its reservation holds (0 without an estimate)."""
        return self.estimate or 0

    @property
    def budgeted(self) -> bool:
        return any(budget.covers(*self.key) for budget in BUDGETS)


def read_logs(paths: list[Path]) -> dict[str, Turn]:
    """Every request the workers enqueued, with the fate and usage of those that were driven (by any worker)."""
    turns: dict[str, Turn] = {}
    ends: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "enqueued":
                turns[record["request_id"]] = Turn((record["key"][0], record["key"][1]), record["estimate"])
            else:
                ends.append(record)
    for record in ends:
        turn = turns[record["request_id"]]
        assert turn.fate is None, f"{record['request_id']} was driven twice"
        turn.fate, turn.usage = record["fate"], record["usage"]
    return turns


@attrs.define
class Charge:
    """A reservation as replayed: when it was made, its key and its tokens as known so far, its state."""

    at: int
    key: tuple[str, str]
    tokens: int
    state: str = "reserved"


@attrs.define
class Findings:
    """What the replay found: violations (empty for a sound run) and how full each budget ever got."""

    violations: list[str] = attrs.field(factory=list)
    fullest_requests: Counter[Budget] = attrs.field(factory=Counter)
    fullest_tokens: Counter[Budget] = attrs.field(factory=Counter)
    charges: dict[str, Charge] = attrs.field(factory=dict)
    budgeted_admissions: int = 0
    #: When the last budgeted request of each key was admitted (ms after the first admission).
    last_admission: dict[str, int] = attrs.field(factory=dict)


def check_windows(events: list[Any], turns: dict[str, Turn], request_of: dict[str, str]) -> Findings:
    """Replay the journal in ``event_seq`` order and check every budget window at every admission.

    At each ``request_admitted`` of a budgeted request at ``t``, for every budget covering its key, the charges made
    so far (events numbered lower) in the window, ``charged_at > t - window_ms`` (the plane's rule: charges stamped
    later than ``t``, by a worker whose clock read later but committed first, count too), must leave room for it:
    one more request within ``max_requests``, and tokens below ``max_tokens`` with the estimate fitting on top
    (``used < max and used + estimate <= max``). A charge's tokens are its estimate until its ``budget_settled``,
    then the usage its worker logged (``reconciled``) or the estimate (``charged``, ``retained``); a ``refunded``
    charge no longer counts, neither its request nor its tokens.
    """
    found = Findings()
    ordered = sorted(events, key=lambda e: e.event_seq)
    for position, event in enumerate(ordered):
        correlation = event.correlation_hmac
        request_id = request_of.get(correlation)
        if event.kind == EventKind.REQUEST_ADMITTED:
            assert request_id is not None, f"an admission of an unknown request at {event.event_seq}"
            turn = turns[request_id]
            following = ordered[position + 1] if position + 1 < len(ordered) else None
            reserved = (
                following is not None
                and following.kind == EventKind.BUDGET_RESERVED
                and following.correlation_hmac == correlation
            )
            if not turn.budgeted:
                continue
            found.budgeted_admissions += 1
            first = found.last_admission.setdefault("first", event.occurred_at)
            found.last_admission["/".join(turn.key)] = event.occurred_at - first
            if not reserved or following.occurred_at != event.occurred_at:
                found.violations.append(f"{request_id}: admitted at {event.event_seq} without a budget_reserved beside")
            t = event.occurred_at
            for budget in BUDGETS:
                if not budget.covers(*turn.key):
                    continue
                window = [
                    c
                    for c in found.charges.values()
                    if c.state != "refunded" and budget.covers(*c.key) and c.at > t - budget.window_ms
                ]
                requests, tokens = len(window), sum(c.tokens for c in window)
                if budget.max_requests is not None:
                    found.fullest_requests[budget] = max(found.fullest_requests[budget], requests + 1)
                    if requests + 1 > budget.max_requests:
                        found.violations.append(
                            f"{request_id} admitted at {t} (seq {event.event_seq}) with {requests} requests already"
                            f" in {budget}"
                        )
                if budget.max_tokens is not None:
                    found.fullest_tokens[budget] = max(found.fullest_tokens[budget], tokens + turn.tokens)
                    if not (tokens < budget.max_tokens and tokens + turn.tokens <= budget.max_tokens):
                        found.violations.append(
                            f"{request_id} (estimate {turn.tokens}) admitted at {t} (seq {event.event_seq}) with"
                            f" {tokens} tokens already in {budget}"
                        )
        elif event.kind == EventKind.BUDGET_RESERVED:
            assert request_id is not None, f"a reservation of an unknown request at {event.event_seq}"
            turn = turns[request_id]
            previous = ordered[position - 1]
            if previous.kind != EventKind.REQUEST_ADMITTED or previous.correlation_hmac != correlation:
                found.violations.append(f"{request_id}: budget_reserved at {event.event_seq} not beside its admission")
            if not turn.budgeted:
                found.violations.append(f"{request_id}: reserved though no budget covers {turn.key}")
            if request_id in found.charges:
                found.violations.append(f"{request_id}: reserved twice")
            found.charges[request_id] = Charge(event.occurred_at, turn.key, turn.tokens)
        elif event.kind == EventKind.BUDGET_SETTLED:
            assert request_id is not None, f"a settlement of an unknown request at {event.event_seq}"
            turn, charge = turns[request_id], found.charges.get(request_id)
            if charge is None or charge.state != "reserved" or event.from_state != "reserved":
                found.violations.append(f"{request_id}: settled at {event.event_seq} from {charge}")
                continue
            charge.state = event.to_state
            if event.to_state == "reconciled":
                if turn.usage is None:
                    found.violations.append(f"{request_id}: reconciled, but its worker reported no usage")
                else:
                    charge.tokens = turn.usage
        elif event.kind in (EventKind.BUDGET_USAGE_RECORDED, EventKind.BUDGET_CORRECTED):
            found.violations.append(f"unexpected {event.kind} at {event.event_seq}")
    return found


def check_settlements(events: list[Any], turns: dict[str, Turn], request_of: dict[str, str]) -> list[str]:
    """Every reservation settles exactly once, as its worker's fate says, at the moment and after the event that freed
    its seat; requests without a budget never reserve nor settle."""
    violations: list[str] = []
    by_request: dict[str, list[Any]] = {}
    for event in sorted(events, key=lambda e: e.event_seq):
        request_id = request_of.get(event.correlation_hmac)
        if request_id is not None:
            by_request.setdefault(request_id, []).append(event)
    for request_id, history in by_request.items():
        turn = turns[request_id]
        reserved = [e for e in history if e.kind == EventKind.BUDGET_RESERVED]
        settled = [e for e in history if e.kind == EventKind.BUDGET_SETTLED]
        freed = [e for e in history if e.kind in SEAT_FREEING]
        admitted = [e for e in history if e.kind == EventKind.REQUEST_ADMITTED]
        if not turn.budgeted or not admitted:
            if reserved or settled:
                violations.append(f"{request_id} ({turn.key}, admitted {len(admitted)}) has budget events")
            continue
        expected = FATES[turn.fate] if turn.fate is not None else None
        if len(reserved) != 1 or len(settled) != 1 or len(freed) != 1 or expected is None:
            violations.append(
                f"{request_id}: {len(reserved)} reserved, {len(settled)} settled, {len(freed)} seat freed, {turn.fate}"
            )
            continue
        (settle,), (free,) = settled, freed
        if settle.to_state != expected or settle.to_state not in SEAT_FREEING[free.kind]:
            violations.append(f"{request_id}: {turn.fate} freed by {free.kind} settled {settle.to_state}")
        if settle.occurred_at != free.occurred_at or settle.event_seq < free.event_seq:
            violations.append(f"{request_id}: settled at {settle.occurred_at}, its seat freed at {free.occurred_at}")
    return violations


def check_rows(database: str, found: Findings, turns: dict[str, Turn]) -> list[str]:
    """The charge rows left are exactly the replayed unrefunded charges, each with its estimate, its admission's
    moment and what it settled to (none was pruned: every window of the run is still open)."""
    rows = {
        charge_id: (provider, model, charged_at, requests, reserved, used, state)
        for charge_id, provider, model, charged_at, requests, reserved, used, state in query(
            database,
            "SELECT charge_id, provider, model, charged_at, requests, reserved_tokens, used_tokens, state"
            " FROM budget_charges",
        )
    }
    expected = {}
    for request_id, charge in found.charges.items():
        if charge.state == "refunded":
            continue
        turn = turns[request_id]
        used = {"reserved": None, "retained": None, "charged": turn.tokens, "reconciled": turn.usage}[charge.state]
        expected[request_id] = (*turn.key, charge.at, 1, turn.tokens, used, charge.state)
    return [
        f"{r}: row {rows.get(r)}, replayed {expected.get(r)}"
        for r in sorted(rows.keys() | expected.keys())
        if rows.get(r) != expected.get(r)
    ]


def test_eight_processes_under_request_and_token_budgets_never_overflow_a_window(
    database_url: str, make_plane: Callable[..., AdmissionPlane], budget_workers: list[BudgetWorker], tmp_path: Path
) -> None:
    """Eight processes racing random lifecycles (usage below or above the estimate, none, failures, abandonment,
    operator releases, recovery) under request and token budgets of 300-400 ms and whole-run windows, per
    provider/model and per provider: by journal replay, every admission of a budgeted request left every window of its
    key within its budget (``used < max and used + estimate <= max`` for tokens, counted as known at that moment), was
    reserved in the same transaction, and every reservation settled exactly once as its turn's end requires; the charge
    rows and ``budget_status`` agree with the replay; the unbudgeted key never reserves and keeps being admitted."""
    plane = make_plane(policy=RACE_POLICY)
    policy_json = json.dumps(RACE_POLICY.to_json())
    logs = [tmp_path / f"worker-{index}.jsonl" for index in range(WORKERS)]
    for index in range(WORKERS):
        args = (database_url, str(index), str(RUN_SECONDS), policy_json, str(14_000 + index), str(logs[index]))
        budget_workers.append(BudgetWorker(*args))
    for worker in budget_workers:
        assert worker.read(timeout=120) == {"event": "ready"}
    for worker in budget_workers:
        worker.send({"event": "go"})
    started = time.monotonic()
    reports = [worker.finish(timeout=120) for worker in budget_workers]
    for report in reports:
        assert report["raw"] == [], report["raw"]
        assert report["violations"] == [], report["violations"]
    elapsed = time.monotonic() - started
    totals: Counter[str] = Counter()
    for report in reports:
        totals.update(report["counts"])

    turns = read_logs(logs)
    request_of = {plane._ctx.keys.correlation(request_id): request_id for request_id in turns}
    events = list(read_journal(plane))
    replayed = replay(e for e in events if e.kind not in BUDGET_KINDS)
    assert (replayed.admitted_twice, replayed.requeued, replayed.discontinuities) == ((), (), ())
    assert sum(replayed.admissions.values()) == totals["admitted"]
    assert {request_of[c] for c in replayed.admissions} == {r for r, turn in turns.items() if turn.fate is not None}

    found = check_windows(events, turns, request_of)
    assert found.violations == []
    assert check_settlements(events, turns, request_of) == []
    assert check_rows(database_url, found, turns) == []
    stored = dict(query(database_url, "SELECT request_id, tokens FROM turn_estimates"))
    assert stored == {r: turn.estimate for r, turn in turns.items() if turn.estimate is not None}
    assert scalar(database_url, "SELECT COUNT(*) FROM leases") == 0

    # budget_status (the plane's own sums) agrees with the replay on the whole-run windows.
    status = {(w.provider, w.model, w.window_ms): w for w in plane.budget_status(now=wall_ms())}
    spent: dict[Budget, int] = {}
    for budget in (KEY_LONG, PROVIDER_LONG):
        counted = [c for c in found.charges.values() if c.state != "refunded" and budget.covers(*c.key)]
        window = status[(budget.provider, budget.model, budget.window_ms)]
        assert window.requests == len(counted)
        assert window.reserved_tokens + window.used_tokens == sum(c.tokens for c in counted)
        spent[budget] = window.reserved_tokens + window.used_tokens

    # The run exercised the budgets: each short window was filled to its request limit and (at least half way) its
    # token limit, the whole-run request limit was reached and the whole-run tokens spent (the head of the provider's
    # queue no longer fitting); every kind of settlement happened to budgeted turns; the key without a budget went on.
    summary = {
        "elapsed_s": round(elapsed, 1),
        "admitted": totals["admitted"],
        "budgeted_admissions": found.budgeted_admissions,
        "fullest_requests": {f"{b.provider}/{b.model}/{b.window_ms}": n for b, n in found.fullest_requests.items()},
        "fullest_tokens": {f"{b.provider}/{b.model}/{b.window_ms}": n for b, n in found.fullest_tokens.items()},
        "spent": spent[PROVIDER_LONG],
        "last_admission_ms": found.last_admission,
    }
    print("budget race:", json.dumps(summary))
    for budget in (KEY_SHORT, PROVIDER_SHORT):
        assert found.fullest_requests[budget] == budget.max_requests, summary
        assert found.fullest_tokens[budget] * 2 > (budget.max_tokens or 0), summary
    assert found.fullest_requests[KEY_LONG] == KEY_LONG.max_requests, summary
    assert spent[PROVIDER_LONG] > (PROVIDER_LONG.max_tokens or 0) - MAX_ESTIMATE, summary
    settled = Counter(c.state for c in found.charges.values())
    assert set(settled) == {"reconciled", "charged", "retained", "refunded"}, settled
    unbudgeted = sum(1 for c in replayed.admissions if not turns[request_of[c]].budgeted)
    assert unbudgeted >= 30, summary


if __name__ == "__main__":
    run_worker(*sys.argv[1:])
