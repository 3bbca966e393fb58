"""Several OS processes on one database (an SQLite file or one PostgreSQL database): seats,
admissions and dispatch intents stay exact, judged from the event journal.

Targeted admissions and dispatch intents raced between processes, waiting processes admitted in
order, and whole-lifecycle races with and without a live reaper.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dbutil import query, scalar
from journal_replay import most_at_once, read_journal, replay, timeline
from workers import MODELS, PROVIDER, WorkerProcess, kill_child_group, spawn_child_group, wall_ms

from admission_plane import AdmissionPlane, AdmittedLease, LiveTurnCompletion, Policy
from admission_plane.evidence import capture
from admission_plane.states import EventKind

pytestmark = pytest.mark.slow

RACE_POLICY = (3, 2, 0, 1_800_000, 200)
RACE_WORKERS = 4
RACE_SECONDS = 3.0
ONE_SEAT = (1, 1, 0, 1_800_000, 30_000)


@pytest.fixture
def child_processes() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Real ``sleep`` processes in their own process groups (to be recorded as dispatch children); killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        child = spawn_child_group(("sleep", "600"))
        started.append(child)
        return child

    yield start
    for child in started:
        kill_child_group(child)


def _race(database: str, spawn: Callable[..., WorkerProcess], *, with_reaper: bool) -> tuple[list[dict[str, Any]], Any]:
    policy = json.dumps(RACE_POLICY)
    workers = [
        spawn("race", database, str(index), str(RACE_SECONDS), policy, str(1_000 + index))
        for index in range(RACE_WORKERS)
    ]
    reaper = spawn("reaper-loop", database, str(RACE_SECONDS), "100", policy) if with_reaper else None
    reports = [worker.finish() for worker in workers]
    return reports, None if reaper is None else reaper.finish()


def _assert_race_invariants(database: str, plane: AdmissionPlane, reports: list[dict[str, Any]]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for report in reports:
        assert report["raw"] == [], report["raw"]
        assert report["violations"] == [], report["violations"]
        totals.update(report["counts"])
    assert totals["admitted"] >= 6, totals
    journal = replay(read_journal(plane))
    assert journal.admitted_twice == ()
    assert journal.requeued == ()
    assert journal.discontinuities == ()
    assert sum(journal.admissions.values()) == totals["admitted"]
    assert 2 <= journal.max_seat_holders <= RACE_POLICY[0]
    starts = most_at_once(timeline(read_journal(plane)), lambda _correlation: "all", starts=True)
    assert starts["all"] <= RACE_POLICY[1], "the concurrent-start limit held (starts made by admissions included)"
    assert scalar(database, "SELECT MAX(lease_generation) FROM turn_requests") == 1
    assert scalar(database, "SELECT COUNT(*) FROM leases") == 0
    assert query(
        database,
        "SELECT COUNT(*) FROM turn_payloads p JOIN turn_requests r USING (request_id) WHERE r.state <> 'queued'",
    ) == [(0,)]
    if totals["capacity_failed"]:
        assert scalar(database, "SELECT COUNT(*) FROM cooldowns") >= 1
    return totals


def test_racing_processes_never_exceed_seats_admit_twice_or_requeue(
    database_url: str, make_plane: Callable[..., AdmissionPlane], spawn: Callable[..., WorkerProcess]
) -> None:
    """Four processes racing whole lifecycles on 3 seats never hold more than 3 seats, admit a
    request twice, requeue one, or see a raw driver error."""
    plane = make_plane(policy=Policy(*RACE_POLICY))
    reports, _ = _race(database_url, spawn, with_reaper=False)
    totals = _assert_race_invariants(database_url, plane, reports)
    assert totals["active"] >= 3
    # SQLite: some waiters' admissions started their leases in the same transaction; PostgreSQL never does.
    assert (totals["started_by_admission"] > 0) is (plane.engine.dialect.name == "sqlite"), totals


def test_racing_processes_with_a_live_reaper_never_lose_a_seat_to_it(
    database_url: str, make_plane: Callable[..., AdmissionPlane], spawn: Callable[..., WorkerProcess]
) -> None:
    """A reaper process reaping every 100 ms with live /proc evidence during the race keeps every
    invariant and never releases or recovers a lease of a live connector."""
    plane = make_plane(policy=Policy(*RACE_POLICY))
    reports, reaper = _race(database_url, spawn, with_reaper=True)
    totals = _assert_race_invariants(database_url, plane, reports)
    assert reaper["raw"] == []
    assert reaper["refusals"] == {}
    assert reaper["totals"]["passes"] >= 5
    assert reaper["totals"]["released"] == 0
    assert reaper["totals"]["marked_recovery_required"] == 0
    assert reaper["totals"]["queued_settled"] == 0
    seat_releases = [e for e in read_journal(plane) if e.kind == EventKind.REQUEST_RECOVERY_SEAT_RELEASED]
    assert len(seat_releases) == totals["recovery_released"]


def test_two_processes_admitting_the_same_request_at_the_same_now_get_exactly_one_lease(
    database_url: str, make_plane: Callable[..., AdmissionPlane], spawn: Callable[..., WorkerProcess]
) -> None:
    """Two processes calling admit_request for the same request at the same now get exactly one lease between them,
    round after round."""
    plane = make_plane(policy=Policy(*ONE_SEAT))
    policy = json.dumps(ONE_SEAT)
    contenders = [spawn("admit-request", database_url, policy) for _ in range(2)]
    for contender in contenders:
        assert contender.read()["event"] == "ready"
    base = wall_ms()
    for round_ in range(6):
        request_id = f"targeted-{round_}"
        now = base + round_ * 10
        plane.enqueue_with_payload(
            request_id=request_id,
            session_id="s",
            agent_id="agent-a",
            fingerprint="fp",
            provider=PROVIDER,
            model=MODELS[0],
            now=now,
            plaintext="p",
            expires_at=now + 600_000,
        )
        for contender in contenders:
            contender.send({"request_id": request_id, "now": now})
        answers = [contender.read() for contender in contenders]
        assert all("error" not in answer for answer in answers), answers
        leases = [answer["lease"] for answer in answers if answer["lease"] is not None]
        assert len(leases) == 1, answers
        assert scalar(database_url, "SELECT COUNT(*) FROM leases WHERE request_id = ?", (request_id,)) == 1
        assert plane.get_request(request_id).state == "admitted"
        plane.abandon_before_prompt(AdmittedLease(**leases[0]), now + 1, "cancelled")
    assert replay(read_journal(plane)).admitted_twice == ()


def _seed_record(plane: AdmissionPlane, lease: AdmittedLease, child_pid: int) -> dict[str, Any]:
    return {
        "requestId": lease.request_id,
        "leaseId": lease.lease_id,
        "generation": lease.generation,
        "ownerInstanceId": plane.owner_identity.owner_instance_id,
        "processIdentity": {"connector": plane.owner_identity.to_mapping(), "child": capture(child_pid).to_mapping()},
        "promptChannel": "stdin",
    }


@pytest.mark.parametrize(
    ("second_child", "expected"),
    [
        ("same", {"status": "committed", "idempotent": True, "reason": None}),
        ("different", {"status": "not_committed", "idempotent": None, "reason": "conflicting_intent"}),
    ],
    ids=["same-record", "different-child"],
)
def test_a_dispatch_intent_racing_a_writer_that_holds_the_lock_sees_the_winner_never_a_fault(
    database_url: str,
    make_plane: Callable[..., AdmissionPlane],
    spawn: Callable[..., WorkerProcess],
    child_processes: Callable[[], subprocess.Popen[bytes]],
    second_child: str,
    expected: dict[str, Any],
) -> None:
    """A process committing a dispatch intent while another holds the write lock for 500 ms with the same record gets an
    idempotent commit (conflicting_intent for a different child), never transaction_fault, leaving one identity row and
    one event."""
    plane = make_plane(policy=Policy(*ONE_SEAT))
    policy = json.dumps(ONE_SEAT)
    holder = spawn("dispatch", database_url, "500", policy)
    racer = spawn("dispatch", database_url, "0", policy)
    assert holder.read()["event"] == "ready"
    assert racer.read()["event"] == "ready"
    for round_ in range(2):
        request_id = f"contended-{round_}"
        now = wall_ms()
        plane.enqueue_with_payload(
            request_id=request_id,
            session_id="s",
            agent_id="agent-a",
            fingerprint="fp",
            provider=PROVIDER,
            model=MODELS[0],
            now=now,
            plaintext="p",
            expires_at=now + 600_000,
        )
        lease = plane.admit_next(now, plane.owner_identity.owner_instance_id)
        assert lease is not None
        plane.mark_starting(lease, now + 1)
        first = child_processes()
        other = first if second_child == "same" else child_processes()
        holder.send({"record": _seed_record(plane, lease, first.pid)})
        assert holder.read() == {"event": "in-tx"}
        racer.send({"record": _seed_record(plane, lease, other.pid)})
        assert racer.read() == {"result": expected}
        assert holder.read() == {"result": {"status": "committed", "idempotent": False, "reason": None}}
        assert (
            scalar(database_url, "SELECT COUNT(*) FROM lease_process_identities WHERE lease_id = ?", (lease.lease_id,))
            == 1
        )
        assert (
            scalar(database_url, "SELECT child_pid FROM lease_process_identities WHERE lease_id = ?", (lease.lease_id,))
            == first.pid
        )
        assert plane.get_request(request_id).state == "dispatch_intent"
        plane.abandon_before_prompt(lease, wall_ms(), "cancelled")
    intents = [e for e in read_journal(plane) if e.kind == EventKind.REQUEST_DISPATCH_INTENT]
    assert len(intents) == 2
    assert len({e.correlation_hmac for e in intents}) == 2


def test_waiting_processes_are_admitted_oldest_first_once_the_seat_frees(
    make_plane: Callable[..., AdmissionPlane], database_url: str, spawn: Callable[..., WorkerProcess]
) -> None:
    """Four processes waiting with wait_for_admission behind one held seat are all admitted, in enqueue order, once the
    seat is freed."""
    plane = make_plane(policy=Policy(*ONE_SEAT))
    now = wall_ms()
    plane.enqueue_with_payload(
        request_id="held",
        session_id="s",
        agent_id="holder",
        fingerprint="f",
        provider=PROVIDER,
        model=MODELS[0],
        now=now,
        plaintext="x",
        expires_at=now + 1_800_001,
    )
    held = plane.admit_next(now, "holder")
    assert held is not None
    waiters = []
    for index in range(4):
        waiters.append(spawn("wait", database_url, f"q{index}", json.dumps(ONE_SEAT)))
        assert waiters[-1].read()["event"] == "ready"
    plane.mark_starting(held, wall_ms())
    plane.mark_dispatch_intent(held, wall_ms())
    plane.mark_active(held, wall_ms())
    plane.complete_live_turn(held, wall_ms(), LiveTurnCompletion("completed"))
    outcomes = [waiter.finish() for waiter in waiters]
    assert [outcome["admitted"] for outcome in outcomes] == [True] * 4
    names = {plane._ctx.keys.correlation(name): name for name in ("held", "q0", "q1", "q2", "q3")}
    journal = list(read_journal(plane))
    admitted = [names[event.correlation_hmac] for event in journal if event.kind == EventKind.REQUEST_ADMITTED]
    assert admitted == ["held", "q0", "q1", "q2", "q3"]
    assert replay(journal).max_seat_holders == 1
