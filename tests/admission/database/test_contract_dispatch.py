"""Dispatch intent with process identity: recorded, replays, stale, conflicts, invalid shapes, faults."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from dbutil import count, event_kinds, journal_fault, lease_phase, query, request_state, table_dump
from planes import dispatch_record, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    AdmittedLease,
    DispatchIntentResult,
    DispatchRecord,
    FaultInjection,
    LiveTurnCompletion,
)

OTHER_OWNER = "7c1d2e3f-4a5b-4c6d-9e8f-abcdef012345"
CLOCK_MS = 1_700_000_123_456

COMMITTED = DispatchIntentResult("committed", idempotent=False)
COMMITTED_AGAIN = DispatchIntentResult("committed", idempotent=True)
RECORDED = DispatchIntentResult("recorded", idempotent=False)
RECORDED_AGAIN = DispatchIntentResult("recorded", idempotent=True)


def not_committed(reason: str) -> DispatchIntentResult:
    return DispatchIntentResult("not_committed", reason=reason)


def not_recorded(reason: str) -> DispatchIntentResult:
    return DispatchIntentResult("not_recorded", reason=reason)


def seed_mapping(record: DispatchRecord) -> dict[str, Any]:
    """The seed's camelCase shape of ``record``."""
    return {
        "requestId": record.request_id,
        "leaseId": record.lease_id,
        "generation": record.generation,
        "ownerInstanceId": record.owner_instance_id,
        "processIdentity": {"connector": record.connector.to_mapping(), "child": record.child.to_mapping()},
        "promptChannel": str(record.prompt_channel),
    }


@pytest.fixture
def clocked(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    """A plane whose wall clock always reads :data:`CLOCK_MS`."""
    return make_plane(clock=lambda: CLOCK_MS)


@pytest.fixture
def starting(clocked: AdmissionPlane) -> AdmittedLease:
    return lease_in_phase(clocked, "starting")


IDENTITY_COLUMNS = (
    "lease_id, request_id, lease_generation, owner_instance_id, prompt_channel, "
    "connector_owner_instance_id, connector_created_at, connector_boot_id, connector_pid, "
    "connector_start_time_ticks, connector_pid_namespace_inode, connector_ppid, connector_pgrp, connector_session, "
    "child_boot_id, child_pid, child_start_time_ticks, child_pid_namespace_inode, child_ppid, child_pgrp, "
    "child_session, recorded_at"
)


def expected_identity_row(record: DispatchRecord, recorded_at: int) -> tuple[Any, ...]:
    c, child = record.connector.process, record.child
    return (
        record.lease_id,
        record.request_id,
        record.generation,
        record.owner_instance_id,
        str(record.prompt_channel),
        record.connector.owner_instance_id,
        record.connector.created_at,
        c.boot_id,
        c.pid,
        c.start_time_ticks,
        c.pid_namespace_inode,
        c.ppid,
        c.pgrp,
        c.session,
        child.boot_id,
        child.pid,
        child.start_time_ticks,
        child.pid_namespace_inode,
        child.ppid,
        child.pgrp,
        child.session,
        recorded_at,
    )


# --- happy path -----------------------------------------------------------------------------------------


def test_record_process_identity_reports_recorded_and_moves_lease_and_request_to_dispatch_intent(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """A valid record for a starting lease is reported recorded (not idempotent) and moves both lease and request to
    dispatch_intent."""
    assert clocked.record_process_identity(dispatch_record(clocked, starting)) == RECORDED
    assert lease_phase(database_url, starting.lease_id) == "dispatch_intent"
    assert request_state(database_url, starting.request_id) == "dispatch_intent"


def test_commit_dispatch_intent_reports_committed_on_first_write(
    clocked: AdmissionPlane, starting: AdmittedLease
) -> None:
    """commit_dispatch_intent reports committed, not idempotent, on the first write."""
    assert clocked.commit_dispatch_intent(dispatch_record(clocked, starting)) == COMMITTED


def test_identity_row_holds_every_connector_and_child_field_and_the_prompt_channel(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """Recording writes exactly one identity row holding the fence, the prompt channel and every connector and child
    field."""
    record = dispatch_record(clocked, starting, prompt_channel="pty")
    clocked.record_process_identity(record)
    assert query(database_url, f"SELECT {IDENTITY_COLUMNS} FROM lease_process_identities") == [
        expected_identity_row(record, CLOCK_MS)
    ]


def test_dispatch_intent_journals_one_event_at_the_wall_clock(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """Recording journals one starting-to-dispatch_intent event stamped by the plane's clock, not by a caller's
    value."""
    before = len(event_kinds(database_url))
    clocked.record_process_identity(dispatch_record(clocked, starting))
    assert query(
        database_url, "SELECT kind, from_state, to_state, occurred_at FROM events WHERE event_seq > ?", (before,)
    ) == [("request_dispatch_intent", "starting", "dispatch_intent", CLOCK_MS)]


def test_dispatch_intent_stamps_the_lease_heartbeat_with_the_wall_clock(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """Recording sets the lease heartbeat to the plane's wall-clock time."""
    clocked.record_process_identity(dispatch_record(clocked, starting))
    assert query(database_url, "SELECT heartbeat_at FROM leases") == [(CLOCK_MS,)]


def test_default_clock_is_the_real_wall_clock_in_milliseconds(plane: AdmissionPlane, database_url: str) -> None:
    """Without an injected clock, recorded_at and the heartbeat are the system time in epoch milliseconds."""
    lease = lease_in_phase(plane, "starting")
    low = time.time_ns() // 1_000_000
    plane.record_process_identity(dispatch_record(plane, lease))
    high = time.time_ns() // 1_000_000
    ((recorded_at, heartbeat_at),) = query(
        database_url,
        "SELECT i.recorded_at, l.heartbeat_at FROM lease_process_identities i JOIN leases l USING (lease_id)",
    )
    assert low <= recorded_at == heartbeat_at <= high


def test_seed_camel_case_record_is_accepted(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """The original connector's camelCase mapping of a record writes the same row as the DispatchRecord value."""
    record = dispatch_record(clocked, starting)
    assert clocked.record_process_identity(seed_mapping(record)) == RECORDED
    assert query(database_url, f"SELECT {IDENTITY_COLUMNS} FROM lease_process_identities") == [
        expected_identity_row(record, CLOCK_MS)
    ]


@pytest.mark.parametrize("shape", ["value", "mapping"])
@pytest.mark.parametrize(
    ("entry", "expected"),
    [("commit_dispatch_intent", COMMITTED_AGAIN), ("record_process_identity", RECORDED_AGAIN)],
)
def test_exact_replay_is_idempotent_from_both_entry_points_and_writes_nothing(
    clocked: AdmissionPlane,
    starting: AdmittedLease,
    database_url: str,
    entry: str,
    expected: DispatchIntentResult,
    shape: str,
) -> None:
    """Replaying the recorded identity, as a value or a mapping, is idempotent from either entry point and writes
    nothing."""
    record = dispatch_record(clocked, starting)
    clocked.record_process_identity(record)
    before = table_dump(database_url)
    replay = record if shape == "value" else seed_mapping(record)
    assert getattr(clocked, entry)(replay) == expected
    assert getattr(clocked, entry)(replay) == expected
    assert table_dump(database_url) == before


# --- stale_lease ----------------------------------------------------------------------------------------


def other_owner_record(plane: AdmissionPlane, lease: AdmittedLease) -> DispatchRecord:
    connector = attrs.evolve(plane.owner_identity, owner_instance_id=OTHER_OWNER)
    return dispatch_record(plane, lease, owner_instance_id=OTHER_OWNER, connector=connector)


STALE_RECORDS: dict[str, Callable[[AdmissionPlane, AdmittedLease], DispatchRecord]] = {
    "other owner": other_owner_record,
    "other generation": lambda plane, lease: dispatch_record(plane, lease, generation=lease.generation + 1),
    "unknown lease": lambda plane, lease: dispatch_record(
        plane, lease, lease_id="00000000-0000-4000-8000-000000000000"
    ),
    "other request": lambda plane, lease: dispatch_record(plane, lease, request_id="r-other"),
}


@pytest.mark.parametrize("entry", ["commit_dispatch_intent", "record_process_identity"])
@pytest.mark.parametrize("cause", STALE_RECORDS)
def test_record_that_does_not_match_the_lease_is_stale_and_writes_nothing(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str, cause: str, entry: str
) -> None:
    """A record naming another owner, generation, lease id or request id is stale_lease and writes nothing."""
    enqueue(clocked, "r-other", agent_id="agent-b", now=1_500)
    before = table_dump(database_url)
    result = getattr(clocked, entry)(STALE_RECORDS[cause](clocked, starting))
    expected = not_committed("stale_lease") if entry == "commit_dispatch_intent" else not_recorded("stale_lease")
    assert result == expected
    assert table_dump(database_url) == before
    assert count(database_url, "lease_process_identities") == 0


@pytest.mark.parametrize("phase", ["admitted", "dispatch_ambiguous", "active", "recovery_required"])
def test_record_for_a_lease_outside_starting_and_dispatch_intent_is_stale(
    clocked: AdmissionPlane, database_url: str, phase: str
) -> None:
    """A record for a lease in any phase but starting or dispatch_intent is stale_lease and writes nothing."""
    lease = lease_in_phase(clocked, phase)
    before = table_dump(database_url)
    assert clocked.commit_dispatch_intent(dispatch_record(clocked, lease)) == not_committed("stale_lease")
    assert clocked.record_process_identity(dispatch_record(clocked, lease)) == not_recorded("stale_lease")
    assert table_dump(database_url) == before


@pytest.mark.parametrize("phase", ["admitted", "starting"])
def test_record_after_abandon_before_prompt_is_stale(clocked: AdmissionPlane, database_url: str, phase: str) -> None:
    """After abandon_before_prompt the fence is dead, so recording reports stale_lease and writes nothing."""
    lease = lease_in_phase(clocked, phase)
    clocked.abandon_before_prompt(lease, 2_000, "cancelled")
    before = table_dump(database_url)
    assert clocked.record_process_identity(dispatch_record(clocked, lease)) == not_recorded("stale_lease")
    assert table_dump(database_url) == before
    assert request_state(database_url, lease.request_id) == "cancelled"


# --- conflicting_intent ---------------------------------------------------------------------------------

CONFLICTS: dict[str, Callable[[DispatchRecord], DispatchRecord]] = {
    "child start ticks": lambda r: attrs.evolve(r, child=attrs.evolve(r.child, start_time_ticks="98765432101")),
    "child pid": lambda r: attrs.evolve(r, child=attrs.evolve(r.child, pid=r.child.pid + 1)),
    "child pgrp": lambda r: attrs.evolve(r, child=attrs.evolve(r.child, pgrp=r.child.pgrp + 1)),
    "prompt channel": lambda r: attrs.evolve(r, prompt_channel="pty"),
    "connector created at": lambda r: attrs.evolve(
        r, connector=attrs.evolve(r.connector, created_at="2001-02-03T04:05:06.789Z")
    ),
    "connector ppid": lambda r: attrs.evolve(
        r, connector=attrs.evolve(r.connector, process=attrs.evolve(r.connector.process, ppid=424_242))
    ),
}


@pytest.mark.parametrize("change", CONFLICTS)
def test_different_record_after_a_durable_identity_conflicts_from_both_entry_points(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str, change: str
) -> None:
    """A record differing in any field from the recorded identity is conflicting_intent from either entry point, and the
    first row is kept."""
    first = dispatch_record(clocked, starting)
    clocked.record_process_identity(first)
    before = table_dump(database_url)
    second = CONFLICTS[change](first)
    assert clocked.commit_dispatch_intent(second) == not_committed("conflicting_intent")
    assert clocked.record_process_identity(second) == not_recorded("conflicting_intent")
    assert table_dump(database_url) == before
    assert query(database_url, f"SELECT {IDENTITY_COLUMNS} FROM lease_process_identities") == [
        expected_identity_row(first, CLOCK_MS)
    ]


def test_original_record_is_still_idempotent_after_a_conflict(clocked: AdmissionPlane, starting: AdmittedLease) -> None:
    """A refused conflicting record does not disturb the idempotent replay of the first record."""
    first = dispatch_record(clocked, starting)
    clocked.record_process_identity(first)
    clocked.record_process_identity(CONFLICTS["child start ticks"](first))
    assert clocked.commit_dispatch_intent(first) == COMMITTED_AGAIN


def test_record_for_an_evidence_free_dispatch_intent_conflicts(clocked: AdmissionPlane, database_url: str) -> None:
    """A lease that reached dispatch_intent without a recorded identity cannot get one afterwards
    (conflicting_intent)."""
    lease = lease_in_phase(clocked, "dispatch_intent", identity=False)
    before = table_dump(database_url)
    assert clocked.commit_dispatch_intent(dispatch_record(clocked, lease)) == not_committed("conflicting_intent")
    assert table_dump(database_url) == before


# --- invalid_process_identity ---------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], object]


def _set(path: tuple[str, ...], value: object) -> Mutation:
    def mutate(mapping: dict[str, Any]) -> dict[str, Any]:
        target = mapping
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return mapping

    return mutate


def _drop(path: tuple[str, ...]) -> Mutation:
    def mutate(mapping: dict[str, Any]) -> dict[str, Any]:
        target = mapping
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return mapping

    return mutate


CONNECTOR = ("processIdentity", "connector")
CHILD = ("processIdentity", "child")
TOP_KEYS = ("requestId", "leaseId", "generation", "ownerInstanceId", "processIdentity", "promptChannel")
PROCESS_KEYS = ("bootId", "pid", "startTimeTicks", "pidNamespaceInode", "ppid", "pgrp", "session")

INVALID: dict[str, Mutation] = {
    **{f"missing {key}": _drop((key,)) for key in TOP_KEYS},
    "extra top-level key": _set(("fingerprint",), "x"),
    "missing connector": _drop(CONNECTOR),
    "missing child": _drop(CHILD),
    "extra process identity key": _set(("processIdentity", "grandchild"), {}),
    "process identity not a mapping": _set(("processIdentity",), ["connector", "child"]),
    "missing connector ownerInstanceId": _drop((*CONNECTOR, "ownerInstanceId")),
    "missing connector createdAt": _drop((*CONNECTOR, "createdAt")),
    **{f"missing connector {key}": _drop((*CONNECTOR, key)) for key in PROCESS_KEYS},
    "extra connector key": _set((*CONNECTOR, "cwd"), "/"),
    **{f"missing child {key}": _drop((*CHILD, key)) for key in PROCESS_KEYS},
    "extra child key": _set((*CHILD, "ownerInstanceId"), OTHER_OWNER),
    "uppercase owner UUID": lambda m: _set(("ownerInstanceId",), m["ownerInstanceId"].upper())(
        _set((*CONNECTOR, "ownerInstanceId"), m["ownerInstanceId"].upper())(m)
    ),
    "free-form owner id": lambda m: _set(("ownerInstanceId",), "owner-1")(
        _set((*CONNECTOR, "ownerInstanceId"), "owner-1")(m)
    ),
    "UUID v1 owner": lambda m: _set(("ownerInstanceId",), "6ba7b810-9dad-11d1-80b4-00c04fd430c8")(
        _set((*CONNECTOR, "ownerInstanceId"), "6ba7b810-9dad-11d1-80b4-00c04fd430c8")(m)
    ),
    "connector owner differs from record owner": _set((*CONNECTOR, "ownerInstanceId"), OTHER_OWNER),
    "prompt channel file": _set(("promptChannel",), "file"),
    "prompt channel uppercase": _set(("promptChannel",), "STDIN"),
    "prompt channel null": _set(("promptChannel",), None),
    "uppercase boot id": _set((*CHILD, "bootId"), "0D1C2B3A-4F5E-4D6C-8B7A-112233445566"),
    "all-zero boot id": _set((*CONNECTOR, "bootId"), "00000000-0000-0000-0000-000000000000"),
    "boot id with newline": _set((*CHILD, "bootId"), "0d1c2b3a-4f5e-4d6c-8b7a-112233445566\n"),
    "createdAt with offset": _set((*CONNECTOR, "createdAt"), "2023-11-14T22:13:20.000+00:00"),
    "createdAt February 30": _set((*CONNECTOR, "createdAt"), "2023-02-30T00:00:00.000Z"),
    "start ticks zero": _set((*CHILD, "startTimeTicks"), "0"),
    "start ticks leading zero": _set((*CHILD, "startTimeTicks"), "0123"),
    "start ticks above 2^64-1": _set((*CHILD, "startTimeTicks"), str(2**64)),
    "start ticks as a number": _set((*CHILD, "startTimeTicks"), 12345),
    "bool pid": _set((*CHILD, "pid"), True),
    "zero pid": _set((*CHILD, "pid"), 0),
    "pid above 2^31-1": _set((*CONNECTOR, "pid"), 2**31),
    "float pid": _set((*CHILD, "pid"), 1234.5),
    "negative ppid": _set((*CHILD, "ppid"), -1),
    "pgrp above 2^31-1": _set((*CHILD, "pgrp"), 2**31),
    "negative session": _set((*CONNECTOR, "session"), -1),
    "namespace inode above 2^32-1": _set((*CHILD, "pidNamespaceInode"), 2**32),
    "zero generation": _set(("generation",), 0),
    "bool generation": _set(("generation",), True),
    "string generation": _set(("generation",), "1"),
    "empty request id": _set(("requestId",), ""),
    "request id with surrounding space": _set(("requestId",), " r1"),
    "lease id with newline": _set(("leaseId",), "lease\n1"),
}


@pytest.mark.parametrize("mutation", INVALID)
def test_malformed_seed_record_is_invalid_and_touches_nothing(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str, mutation: str
) -> None:
    """A mapping that deviates from the exact camelCase record shape or its formats is invalid_process_identity from
    both entry points and writes nothing."""
    mapping = INVALID[mutation](copy.deepcopy(seed_mapping(dispatch_record(clocked, starting))))
    before = table_dump(database_url)
    assert clocked.commit_dispatch_intent(mapping) == not_committed("invalid_process_identity")
    assert clocked.record_process_identity(mapping) == not_recorded("invalid_process_identity")
    assert table_dump(database_url) == before


@pytest.mark.parametrize("value", [None, "record", 42, ["requestId"], ("r1", "lease")], ids=repr)
def test_record_that_is_not_a_mapping_is_invalid(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str, value: object
) -> None:
    """Anything but a DispatchRecord or a mapping is invalid_process_identity and writes nothing."""
    before = table_dump(database_url)
    assert clocked.commit_dispatch_intent(value) == not_committed("invalid_process_identity")
    assert table_dump(database_url) == before


def test_lease_admitted_with_a_free_form_owner_can_never_reach_dispatch_intent_this_way(
    clocked: AdmissionPlane, database_url: str
) -> None:
    """A lease admitted for an owner id that is not a canonical UUIDv4 can carry no valid record and stays starting."""
    enqueue(clocked, "r1")
    lease = clocked.admit_next(1_001, "owner-1")
    assert lease is not None
    clocked.mark_starting(lease, 1_002)
    mapping = seed_mapping(dispatch_record(clocked, lease))
    mapping["ownerInstanceId"] = mapping["processIdentity"]["connector"]["ownerInstanceId"] = "owner-1"
    assert clocked.record_process_identity(mapping) == not_recorded("invalid_process_identity")
    assert lease_phase(database_url, lease.lease_id) == "starting"


# --- transaction fault ----------------------------------------------------------------------------------


def _fail() -> None:
    raise RuntimeError("injected fault after the identity row")


@pytest.fixture
def faulty(make_plane: Callable[..., AdmissionPlane]) -> AdmissionPlane:
    return make_plane(fault_injection=FaultInjection(after_process_identity_persisted=_fail))


def test_fault_after_identity_persisted_reports_transaction_fault_and_rolls_back(
    faulty: AdmissionPlane, database_url: str
) -> None:
    """A fault raised after the identity row is written is transaction_fault and rolls back the row, the phase change
    and the event."""
    lease = lease_in_phase(faulty, "starting")
    before = table_dump(database_url)
    assert faulty.record_process_identity(dispatch_record(faulty, lease)) == not_recorded("transaction_fault")
    assert faulty.commit_dispatch_intent(dispatch_record(faulty, lease)) == not_committed("transaction_fault")
    assert table_dump(database_url) == before
    assert count(database_url, "lease_process_identities") == 0
    assert (lease_phase(database_url, lease.lease_id), request_state(database_url, "r1")) == ("starting", "starting")
    assert ("request_dispatch_intent", "starting", "dispatch_intent") not in event_kinds(database_url)


def test_fresh_plane_records_the_identity_after_a_faulted_attempt(
    faulty: AdmissionPlane, make_plane: Callable[..., AdmissionPlane], database_url: str
) -> None:
    """After a faulted attempt, a fresh plane's record is a first write and its commit an idempotent replay, with one
    row and one event."""
    lease = lease_in_phase(faulty, "starting")
    record = dispatch_record(faulty, lease)
    faulty.record_process_identity(record)
    faulty.close()
    reopened = make_plane(owner_identity=faulty.owner_identity)
    assert reopened.record_process_identity(record) == RECORDED
    assert reopened.commit_dispatch_intent(record) == COMMITTED_AGAIN
    assert count(database_url, "lease_process_identities") == 1
    assert event_kinds(database_url).count(("request_dispatch_intent", "starting", "dispatch_intent")) == 1


def test_driver_error_inside_the_transaction_is_reported_as_transaction_fault(
    clocked: AdmissionPlane, starting: AdmittedLease, database_url: str
) -> None:
    """A database error inside the transaction that is not contention (an aborting journal trigger) is reported as
    transaction_fault, never raised."""
    with journal_fault(database_url):
        result = clocked.record_process_identity(dispatch_record(clocked, starting))
    assert result == not_recorded("transaction_fault")
    assert count(database_url, "lease_process_identities") == 0
    assert lease_phase(database_url, starting.lease_id) == "starting"


# --- identity rows follow the lease ---------------------------------------------------------------------

FREEING: dict[str, tuple[str, Callable[[AdmissionPlane, AdmittedLease], object]]] = {
    "complete_live_turn": (
        "active",
        lambda p, lease: p.complete_live_turn(lease, 9_000, LiveTurnCompletion("completed")),
    ),
    "abandon_before_prompt": ("dispatch_intent", lambda p, lease: p.abandon_before_prompt(lease, 9_000, "failed")),
    "release_exited_recovery_seat": (
        "recovery_required",
        lambda p, lease: p.release_exited_recovery_seat(lease, 9_000),
    ),
}


@pytest.mark.parametrize("operation", FREEING)
def test_identity_row_is_deleted_with_its_lease(clocked: AdmissionPlane, database_url: str, operation: str) -> None:
    """Deleting the lease by completion, abandonment or recovery seat release deletes its identity row too."""
    phase, free = FREEING[operation]
    lease = lease_in_phase(clocked, phase)
    assert count(database_url, "lease_process_identities") == 1
    free(clocked, lease)
    assert count(database_url, "leases") == 0
    assert count(database_url, "lease_process_identities") == 0


@pytest.mark.parametrize("phase", ["recovery_required", "dispatch_ambiguous"])
def test_identity_row_is_kept_while_the_lease_is_retained(
    clocked: AdmissionPlane, database_url: str, phase: str
) -> None:
    """A lease kept in recovery_required or dispatch_ambiguous keeps its identity row."""
    lease_in_phase(clocked, phase)
    assert count(database_url, "leases") == 1
    assert count(database_url, "lease_process_identities") == 1
