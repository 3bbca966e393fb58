"""Reaper hardening on both dialects, with an injected /proc.

* One odd row cannot stop recovery: every request field has one validator, used by the
  write (enqueue) and by every read (the recovery inventory); a row corrupted behind the
  plane's back is reported and left alone while every other lease is judged.
* A connector killed before its dispatch intent gives its seat back once ``/proc`` proves
  it gone (no prompt can have been written), ending the request ``cancelled``.
* The operator's lever: ``release_lease`` and ``admission-plane release``.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dbutil import count, event_kinds, exactly, execute, is_postgres, lease_phase, query, request_state, table_dump
from fake_proc import OWNER_B, FakeProc, connector, process
from planes import CONTENT_KEY, ENCRYPTION_KEY, admit, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    AdmissionStateError,
    AdmittedLease,
    InvalidInputError,
    Policy,
    ReaperSummary,
    RecoverableDispatchInventoryError,
    UnknownLeaseError,
)
from admission_plane.keys import CONTENT_KEY_VARIABLE, ENCRYPTION_KEY_VARIABLE

OWNER_C = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9"
CONNECTOR = connector(100)
QUEUED_OWNER = connector(300, owner=OWNER_B)
#: A connector that admits without ever having enqueued anything.
ADMITTER = connector(500, owner=OWNER_C)
INTENT_CLOCK = 1_003
UNTRUSTED_EVENT = ("recovery_row_retained", "untrusted", "retained")


@pytest.fixture
def plane(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane whose connector identity is the fake pid 100."""
    return make_plane(owner_identity=CONNECTOR, clock=lambda: INTENT_CLOCK)


@pytest.fixture
def one_seat(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A one-seat plane whose connector identity is the fake pid 100."""
    return make_plane(owner_identity=CONNECTOR, clock=lambda: INTENT_CLOCK, policy=Policy(1, 1, 0, 1_800_000, 30_000))


def child(n: int = 1):  # type: ignore[no-untyped-def]
    return process(200 + n, ppid=CONNECTOR.process.pid)


def dispatched(plane: AdmissionPlane, phase: str, n: int = 1, now: int = 1_000) -> AdmittedLease:
    """Request ``r<n>`` (agent ``a<n>``) driven to ``phase`` with the fake child ``child(n)``."""
    return lease_in_phase(plane, phase, f"r{n}", now, agent_id=f"a{n}", child=child(n))


def suspicion(database: str, lease: AdmittedLease) -> tuple[int | None, str | None]:
    (found,) = query(database, "SELECT suspect_since, suspect_reason FROM leases WHERE lease_id = ?", (lease.lease_id,))
    return found


def correlations_of_requests(database: str) -> set[str]:
    return {row[0] for row in query(database, "SELECT correlation_hmac FROM events WHERE kind = 'request_enqueued'")}


# --- item 4: what a write accepts, every later read accepts ---------------------------------------------

ODD_VALUES = {
    "257 characters": "x" * 257,
    "leading space": " padded",
    "trailing space": "padded ",
    "newline": "line\nbreak",
    "DEL": "del\x7f",
}


@pytest.mark.parametrize("field", ["session_id", "provider", "model"])
@pytest.mark.parametrize("value", ODD_VALUES.values(), ids=list(ODD_VALUES))
def test_enqueue_refuses_metadata_the_recovery_inventory_would_refuse(
    plane: AdmissionPlane, database_url: str, field: str, value: str
) -> None:
    """Both enqueues refuse a session id, provider or model the recovery inventory would refuse, writing nothing."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(f"invalid request metadata {field}")):
        enqueue(plane, "r-odd", **{field: value})
    fields = {"session_id": "s", "agent_id": "a", "fingerprint": "f", "provider": "p", "model": "m", field: value}
    with pytest.raises(InvalidInputError, match=exactly(f"invalid request metadata {field}")):
        plane.enqueue(request_id="r-odd", now=1_000, **fields)
    assert table_dump(database_url) == before


CANDIDATES = ["m", "x" * 256, "x" * 257, "model a", "modèle-ü", " padded", "padded ", "a\tb", "a\x7fb", "a\0b", "  "]


@pytest.mark.parametrize("field", ["session_id", "provider", "model"])
def test_the_inventory_accepts_exactly_what_enqueue_accepts(
    plane: AdmissionPlane, database_url: str, field: str
) -> None:
    """For every candidate value, enqueue accepts it exactly when the recovery inventory accepts it in a stored row."""
    dispatched(plane, "active")
    for n, value in enumerate(CANDIDATES):
        if is_postgres(database_url) and "\0" in value:
            continue  # a PostgreSQL text column cannot hold NUL at all
        try:
            enqueue(plane, f"probe-{n}", now=1_100 + n, **{field: value})
        except InvalidInputError:
            accepted = False
        else:
            accepted = True
        execute(database_url, f"UPDATE turn_requests SET {field} = ? WHERE request_id = 'r1'", params=(value,))
        try:
            plane.list_recoverable_dispatches()
        except RecoverableDispatchInventoryError:
            listed = False
        else:
            listed = True
        assert accepted == listed, f"{value!r}: enqueue accepted={accepted}, inventory accepted={listed}"
        assert accepted == (value != "x" * 257 and value.strip() == value and value.isprintable()), repr(value)


LEASE_CORRUPTIONS = {
    "padded session id": "UPDATE turn_requests SET session_id = session_id || ' ' WHERE request_id = 'r2'",
    "257-character model": f"UPDATE turn_requests SET model = '{'m' * 257}' WHERE request_id = 'r2'",
    "child pid 0": "UPDATE lease_process_identities SET child_pid = 0 WHERE request_id = 'r2'",
    "request generation mismatch": "UPDATE turn_requests SET lease_generation = 9 WHERE request_id = 'r2'",
}


@pytest.mark.parametrize("corruption", LEASE_CORRUPTIONS)
def test_an_untrusted_lease_row_is_reported_and_retained_while_every_other_lease_is_judged(
    plane: AdmissionPlane, database_url: str, corruption: str
) -> None:
    """A lease row corrupted after enqueue is journalled without identifiers and left alone; the rest is judged."""
    dispatched(plane, "recovery_required", 1, now=1_000)  # every process gone: released
    bad = dispatched(plane, "recovery_required", 2, now=1_100)  # corrupted below, every process gone too
    judged = dispatched(plane, "active", 3, now=1_200)  # connector gone, child alive: recovery required
    execute(database_url, LEASE_CORRUPTIONS[corruption])
    with pytest.raises(RecoverableDispatchInventoryError):
        plane.list_recoverable_dispatches()  # its direct callers still get the all-or-nothing contract

    result = plane.reap_suspects(2_000, FakeProc().alive(child(3)))

    assert result == ReaperSummary(inspected=2, released=1, retained=1, marked_recovery_required=1, untrusted=1)
    assert query(database_url, "SELECT request_id FROM leases ORDER BY request_id") == [("r2",), ("r3",)]
    assert lease_phase(database_url, bad.lease_id) == "recovery_required"
    assert suspicion(database_url, bad) == (None, None)
    assert lease_phase(database_url, judged.lease_id) == "recovery_required"
    assert event_kinds(database_url).count(UNTRUSTED_EVENT) == 1
    (reported,) = query(database_url, "SELECT correlation_hmac FROM events WHERE kind = 'recovery_row_retained'")
    assert reported[0] not in correlations_of_requests(database_url)


def test_an_untrusted_queued_owner_row_is_reported_and_other_queued_owners_are_still_settled(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A corrupted queued-owner row is reported, its request stays queued; a dead owner's request is still settled."""
    enqueue(plane, "q-bad", now=1_000, owner_identity=QUEUED_OWNER)
    enqueue(plane, "q-dead", now=1_100, owner_identity=ADMITTER)
    execute(database_url, "UPDATE queued_owner_instances SET pid = 0 WHERE owner_instance_id = ?", params=(OWNER_B,))

    assert plane.reap_suspects(2_000, FakeProc()) == ReaperSummary(queued_settled=1, untrusted=1)
    assert (request_state(database_url, "q-bad"), request_state(database_url, "q-dead")) == ("queued", "cancelled")
    assert event_kinds(database_url).count(UNTRUSTED_EVENT) == 1


def cli(workdir: Path, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
    """``python -m admission_plane ARGS`` with the test keys in the environment, outside the source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_PLANE_")}
    env.update(
        {
            ENCRYPTION_KEY_VARIABLE: ENCRYPTION_KEY.hex(),
            CONTENT_KEY_VARIABLE: CONTENT_KEY.hex(),
            "XDG_STATE_HOME": str(workdir / "state"),
        }
    )
    options.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "admission_plane", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **options,
    )


def test_reap_command_prints_a_line_for_untrusted_rows(
    make_plane: Callable[..., AdmissionPlane], database_url: str, tmp_path: Path
) -> None:
    """``admission-plane reap`` names how many rows it could not trust (no identifier) and still judges the rest."""
    plane = make_plane(policy=Policy(3, 3, 0, 1_800_000, 30_000))  # this very process: a live connector
    lease_in_phase(plane, "admitted", "r-live", now=1_000)
    lease_in_phase(plane, "admitted", "r-odd", now=1_100, agent_id="agent-b")
    execute(database_url, "UPDATE turn_requests SET session_id = ' odd' WHERE request_id = 'r-odd'")

    result = cli(tmp_path, "reap", "--db", database_url)

    assert result.returncode == 0, result.stderr
    assert "untrusted 1" in result.stdout
    assert any(line.startswith("1 recovery row could not be trusted") for line in result.stdout.splitlines())
    assert "r-odd" not in result.stdout
    assert count(database_url, "leases") == 2
    assert event_kinds(database_url).count(UNTRUSTED_EVENT) == 1


# --- item 5: the seat of a connector that died before its dispatch intent ----------------------------------


@pytest.mark.parametrize("phase", ["admitted", "starting"])
@pytest.mark.parametrize(
    "make_readers", [FakeProc, lambda: FakeProc().reused(CONNECTOR)], ids=["holder gone", "holder pid reused"]
)
def test_a_pre_dispatch_lease_whose_holder_is_proved_gone_is_freed_and_ends_cancelled(
    one_seat: AdmissionPlane, database_url: str, phase: str, make_readers: Callable[[], FakeProc]
) -> None:
    """A pre-dispatch lease whose holder /proc proves gone is freed and ends cancelled; the seat takes new work."""
    lease = lease_in_phase(one_seat, phase, now=1_000)

    assert one_seat.reap_suspects(2_000, make_readers()) == ReaperSummary(inspected=1, released=1)

    assert lease_phase(database_url, lease.lease_id) is None
    assert request_state(database_url, "r1") == "cancelled"
    assert count(database_url, "turn_payloads", "request_id = 'r1'") == 0
    assert event_kinds(database_url)[-1] == ("lease_owner_dead", phase, "cancelled")
    assert one_seat.reap_suspects(2_001, make_readers()) == ReaperSummary()
    enqueue(one_seat, "r2", agent_id="agent-b", now=2_002, owner_identity=QUEUED_OWNER)
    assert admit(one_seat, 2_003).request_id == "r2"
    assert [to for _, source, to in event_kinds(database_url) if source != "absent"].count("queued") == 0


@pytest.mark.parametrize("phase", ["admitted", "starting"])
@pytest.mark.parametrize(
    ("make_readers", "suspected"),
    [
        (lambda: FakeProc().alive(CONNECTOR), None),
        (lambda: FakeProc().alive(CONNECTOR, ppid=4_242), None),
        (lambda: FakeProc().unreadable(CONNECTOR.process.pid), "identity_unverifiable"),
        (lambda: FakeProc(boot_id=PermissionError(13, "denied")), "identity_unverifiable"),
    ],
    ids=["alive", "reparented", "unreadable", "boot id unreadable"],
)
def test_a_pre_dispatch_lease_is_retained_unless_its_holder_is_proved_gone(
    plane: AdmissionPlane,
    database_url: str,
    phase: str,
    make_readers: Callable[[], FakeProc],
    suspected: str | None,
) -> None:
    """A live or unverifiable holder keeps its pre-dispatch seat; only unverifiable evidence marks the lease suspect."""
    lease = lease_in_phase(plane, phase, now=1_000)
    before = event_kinds(database_url)

    result = plane.reap_suspects(2_000, make_readers())

    assert result == ReaperSummary(inspected=1, retained=1, suspected=int(suspected is not None))
    assert lease_phase(database_url, lease.lease_id) == phase
    assert suspicion(database_url, lease) == ((2_000, suspected) if suspected else (None, None))
    assert event_kinds(database_url) == before


def test_a_stale_pre_dispatch_lease_of_a_live_holder_is_only_suspected(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A live holder whose heartbeat is stale keeps its seat; the lease is only marked heartbeat_expired."""
    lease = lease_in_phase(plane, "starting", now=1_000)
    assert plane.reap_suspects(10_000, FakeProc().alive(CONNECTOR)) == ReaperSummary(
        inspected=1, retained=1, suspected=1
    )
    assert suspicion(database_url, lease) == (10_000, "heartbeat_expired")


def test_another_hosts_pre_dispatch_lease_is_retained(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """A holder recorded by another host is never judged here, even when its pid is absent on this host."""
    writer = make_plane(owner_identity=CONNECTOR, host_id="host-a")
    lease = lease_in_phase(writer, "admitted", now=1_000)
    reaper = make_plane(owner_identity=ADMITTER, host_id="host-b")

    assert reaper.reap_suspects(2_000, FakeProc()) == ReaperSummary(inspected=1, retained=1)
    assert reaper.reap_suspects(10_000, FakeProc()) == ReaperSummary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == "admitted"
    assert suspicion(database_url, lease) == (10_000, "heartbeat_expired")


def test_the_connector_that_admitted_the_lease_is_judged_not_the_one_that_enqueued_it(
    plane: AdmissionPlane, database_url: str
) -> None:
    """The holder is the lease's owner instance: its death frees the seat, the enqueuing connector's death does not."""
    enqueue(plane, "r1", now=1_000, owner_identity=QUEUED_OWNER)
    lease = admit(plane, 1_001)  # admitted by CONNECTOR, enqueued by QUEUED_OWNER

    assert plane.reap_suspects(2_000, FakeProc().alive(CONNECTOR)) == ReaperSummary(inspected=1, retained=1)
    assert lease_phase(database_url, lease.lease_id) == "admitted"
    assert plane.reap_suspects(2_001, FakeProc().alive(QUEUED_OWNER)) == ReaperSummary(inspected=1, released=1)
    assert request_state(database_url, "r1") == "cancelled"


def test_a_connector_that_admits_without_having_enqueued_is_recorded_at_admission(
    make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """A plane admitting under its own owner instance records its identity, so its death frees the seat too."""
    enqueuer = make_plane(owner_identity=QUEUED_OWNER)
    enqueue(enqueuer, "r1", now=1_000)
    admitter = make_plane(owner_identity=ADMITTER)
    lease = admitter.admit_next(1_001, ADMITTER.owner_instance_id)
    assert lease is not None
    assert count(database_url, "queued_owner_instances", "owner_instance_id = ?", (OWNER_C,)) == 1

    assert admitter.reap_suspects(2_000, FakeProc().alive(ADMITTER)) == ReaperSummary(inspected=1, retained=1)
    assert admitter.reap_suspects(2_001, FakeProc().alive(QUEUED_OWNER)) == ReaperSummary(inspected=1, released=1)
    assert request_state(database_url, "r1") == "cancelled"


def test_a_pre_dispatch_lease_of_an_unrecorded_owner_is_retained_as_unverifiable(
    plane: AdmissionPlane, database_url: str
) -> None:
    """A lease admitted under an owner instance whose identity nobody recorded can never be proved gone."""
    enqueue(plane, "r1", now=1_000)
    lease = plane.admit_next(1_001, "an-owner-that-recorded-no-identity")
    assert lease is not None

    assert plane.reap_suspects(2_000, FakeProc()) == ReaperSummary(inspected=1, retained=1, suspected=1)
    assert suspicion(database_url, lease) == (2_000, "identity_unverifiable")
    assert request_state(database_url, "r1") == "admitted"


def test_a_dispatch_intent_without_evidence_is_never_freed_by_its_holders_death(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Once the dispatch intent is durable a gone holder frees nothing: the prompt may have been written."""
    lease = lease_in_phase(plane, "dispatch_intent", now=1_000, identity=False)
    assert plane.reap_suspects(2_000, FakeProc(pids=[])) == ReaperSummary(inspected=1, retained=1, suspected=1)
    assert lease_phase(database_url, lease.lease_id) == "dispatch_intent"


@pytest.mark.parametrize("phase", ["dispatch_intent", "active", "recovery_required"])
def test_settling_a_holders_death_refuses_a_lease_past_its_dispatch_intent(
    plane: AdmissionPlane, database_url: str, phase: str
) -> None:
    """The fenced operation itself refuses any lease whose prompt may have been written, changing nothing."""
    lease = dispatched(plane, phase)
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly("lease is not before its dispatch intent")):
        plane.settle_lease_owner_death(lease, 2_000)
    assert table_dump(database_url) == before


# --- item 6: the operator's release -----------------------------------------------------------------------

OPERATOR_OUTCOMES = {
    "admitted": "cancelled",
    "starting": "cancelled",
    "dispatch_intent": "recovery_required",
    "dispatch_ambiguous": "recovery_required",
    "active": "recovery_required",
    "recovery_required": "recovery_required",
}


@pytest.mark.parametrize("phase", OPERATOR_OUTCOMES)
def test_operator_release_frees_the_seat_and_never_requeues(
    one_seat: AdmissionPlane, database_url: str, phase: str
) -> None:
    """Releasing a lease by id frees its seat, journals operator_seat_released, ends the request as the table says."""
    lease = dispatched(one_seat, phase)

    released = one_seat.release_lease(lease.lease_id, 2_000)

    outcome = OPERATOR_OUTCOMES[phase]
    assert (released.phase, released.outcome) == (phase, outcome)
    assert lease_phase(database_url, lease.lease_id) is None
    assert request_state(database_url, "r1") == outcome
    assert count(database_url, "turn_payloads") == 0
    assert event_kinds(database_url)[-1] == ("operator_seat_released", phase, outcome)
    enqueue(one_seat, "r2", agent_id="agent-b", now=2_001)
    assert admit(one_seat, 2_002).request_id == "r2"
    assert request_state(database_url, "r1") == outcome


def test_operator_release_of_an_unknown_or_invalid_lease_changes_nothing(
    plane: AdmissionPlane, database_url: str
) -> None:
    """An unknown lease id is UnknownLeaseError and a malformed one InvalidInputError; nothing is written."""
    dispatched(plane, "active")
    before = table_dump(database_url)
    with pytest.raises(UnknownLeaseError):
        plane.release_lease("no-such-lease", 2_000)
    with pytest.raises(InvalidInputError):
        plane.release_lease(" padded", 2_000)
    assert table_dump(database_url) == before


def test_release_command_with_yes_frees_the_seat(plane: AdmissionPlane, database_url: str, tmp_path: Path) -> None:
    """``admission-plane release LEASE --yes`` frees the seat and says what became of the request."""
    lease = dispatched(plane, "recovery_required")
    result = cli(tmp_path, "release", lease.lease_id, "--yes", "--db", database_url)
    assert result.returncode == 0, result.stderr
    assert "recovery_required" in result.stdout
    assert lease_phase(database_url, lease.lease_id) is None
    assert request_state(database_url, "r1") == "recovery_required"


def test_release_command_without_a_terminal_or_yes_refuses(
    plane: AdmissionPlane, database_url: str, tmp_path: Path
) -> None:
    """With no terminal on stdin and no ``--yes`` the command refuses with one line and a non-zero status."""
    lease = dispatched(plane, "active")
    before = table_dump(database_url)
    result = cli(tmp_path, "release", lease.lease_id, "--db", database_url)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("admission-plane: error: ")
    assert "--yes" in lines[0]
    assert table_dump(database_url) == before


@pytest.mark.parametrize(("answer", "released"), [("yes", True), ("n", False), ("", False)])
def test_release_command_asks_for_confirmation_on_a_terminal(
    plane: AdmissionPlane, database_url: str, tmp_path: Path, answer: str, released: bool
) -> None:
    """On a terminal the command asks first: only an explicit yes releases the seat."""
    lease = dispatched(plane, "recovery_required")
    leader, follower = pty.openpty()
    try:
        os.write(leader, f"{answer}\n".encode())
        result = cli(tmp_path, "release", lease.lease_id, "--db", database_url, stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert (result.returncode == 0) == released, result.stderr
    assert "release the seat of lease" in result.stderr.lower()
    assert (lease_phase(database_url, lease.lease_id) is None) == released
