"""Recovery inventory: shape, order and fail-closed validation of durable rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from dbutil import cases_with_sqlite_only, exactly, execute
from fake_proc import OWNER_B, connector
from planes import activate, admit, dispatch_record, enqueue, lease_in_phase

from admission_plane import (
    AdmissionPlane,
    DispatchProcessIdentity,
    RecoverableDispatch,
    RecoverableDispatchInventoryError,
    RecoverableQueuedOwner,
)

INVALID_ROW = exactly("recoverable dispatch inventory contains an invalid durable row")


def without_host(entries: tuple[Any, ...]) -> tuple[Any, ...]:
    """The entries with their recording host blanked out, the one field the original connector did not have."""
    return tuple(attrs.evolve(entry, host_id=None) for entry in entries)


# --- list_recoverable_dispatches shape and order ---------------------------------------------------------


def test_recoverable_dispatch_lists_fence_phase_heartbeat_and_process_identity(plane: AdmissionPlane) -> None:
    """list_recoverable_dispatches gives one entry per lease with the request metadata, fence, phase, heartbeat and
    recorded process identity."""
    lease = lease_in_phase(plane, "starting", now=100)
    record = dispatch_record(plane, lease, prompt_channel="pty")
    plane.commit_dispatch_intent(record)
    plane.mark_active(lease, 900)
    assert without_host(plane.list_recoverable_dispatches()) == (
        RecoverableDispatch(
            request_id="r1",
            session_id="session-1",
            provider="antigravity",
            model="model-test",
            fence=lease.fence,
            phase="active",
            heartbeat_at=900,
            process_identity=DispatchProcessIdentity(
                prompt_channel="pty", connector=plane.owner_identity, child=record.child
            ),
        ),
    )


def test_recoverable_dispatch_carries_no_payload_fingerprint_or_agent(plane: AdmissionPlane) -> None:
    """A recoverable dispatch entry exposes no prompt, content fingerprint or agent id."""
    lease_in_phase(plane, "active", now=100)
    (entry,) = plane.list_recoverable_dispatches()
    fields = set(attrs.fields_dict(type(entry)))
    assert not fields & {"agent_id", "fingerprint", "payload", "plaintext", "content_fingerprint"}
    assert "prompt for r1" not in repr(entry)


def test_lease_without_recorded_identity_is_listed_with_null_identity(plane: AdmissionPlane) -> None:
    """A lease that reached dispatch_intent without a recorded identity is listed with process_identity None."""
    lease_in_phase(plane, "dispatch_intent", now=100, identity=False)
    (entry,) = plane.list_recoverable_dispatches()
    assert (entry.phase, entry.process_identity) == ("dispatch_intent", None)


def test_leaseless_requests_are_not_recoverable_dispatches(plane: AdmissionPlane) -> None:
    """Queued and terminal requests hold no lease and are absent from the recoverable dispatches."""
    lease = lease_in_phase(plane, "active", now=100)
    plane.release_exited_recovery_seat(lease, 500)
    enqueue(plane, "r-queued", now=600)
    assert plane.list_recoverable_dispatches() == ()


def test_recoverable_dispatches_are_ordered_by_enqueue_time_then_request_id(plane: AdmissionPlane) -> None:
    """Recoverable dispatches are ordered by enqueue time, then request id, not by admission order."""
    enqueue(plane, "r-0", now=900, model="model-cool")
    enqueue(plane, "r-2", now=1_000)
    enqueue(plane, "r-1", now=1_000)
    plane.set_capacity_cooldown("antigravity", "model-cool", 5_000, 950)
    admitted = []
    for now in (1_001, 2_001, 5_001):
        lease = admit(plane, now)
        activate(plane, lease, now)
        admitted.append(lease.request_id)
    assert admitted == ["r-1", "r-2", "r-0"]
    assert [entry.request_id for entry in plane.list_recoverable_dispatches()] == ["r-0", "r-1", "r-2"]


def test_inventory_is_readable_by_a_fresh_plane(
    plane: AdmissionPlane, make_plane: Callable[..., AdmissionPlane]
) -> None:
    """Another plane opened later on the same database lists the same recoverable dispatches."""
    lease_in_phase(plane, "active", now=100)
    listed = plane.list_recoverable_dispatches()
    plane.close()
    assert make_plane().list_recoverable_dispatches() == listed


# --- corruption fails the whole listing -----------------------------------------------------------------

IDENTITY = "lease_process_identities"
CORRUPTIONS: dict[str, tuple[str, ...]] = {
    "child pid 0": (f"UPDATE {IDENTITY} SET child_pid = 0",),
    "connector pid above 2^31-1": (f"UPDATE {IDENTITY} SET connector_pid = 2147483648",),
    "child start ticks 0": (f"UPDATE {IDENTITY} SET child_start_time_ticks = '0'",),
    "child start ticks as a blob": (f"UPDATE {IDENTITY} SET child_start_time_ticks = CAST('12345' AS BLOB)",),
    "uppercase connector boot id": (f"UPDATE {IDENTITY} SET connector_boot_id = upper(connector_boot_id)",),
    "non-canonical created at": (f"UPDATE {IDENTITY} SET connector_created_at = '2023-11-14T22:13:20Z'",),
    "prompt channel file": (f"UPDATE {IDENTITY} SET prompt_channel = 'file'",),
    "identity owner mismatch": (f"UPDATE {IDENTITY} SET owner_instance_id = 'someone-else'",),
    "identity generation mismatch": (f"UPDATE {IDENTITY} SET lease_generation = lease_generation + 1",),
    "identity request mismatch": (f"UPDATE {IDENTITY} SET request_id = 'r-other'",),
    "connector owner differs from the lease owner": (
        f"UPDATE {IDENTITY} SET connector_owner_instance_id = '{OWNER_B}'",
    ),
    "request generation mismatch": ("UPDATE turn_requests SET lease_generation = lease_generation + 1",),
    "lease phase differs from request state": ("UPDATE turn_requests SET state = 'active'",),
    "terminal lease phase": ("UPDATE leases SET phase = 'completed'", "UPDATE turn_requests SET state = 'completed'"),
    "unknown lease phase": ("UPDATE leases SET phase = 'paused'", "UPDATE turn_requests SET state = 'paused'"),
    "identity while admitted": ("UPDATE leases SET phase = 'admitted'", "UPDATE turn_requests SET state = 'admitted'"),
    "identity while starting": ("UPDATE leases SET phase = 'starting'", "UPDATE turn_requests SET state = 'starting'"),
    "negative heartbeat": ("UPDATE leases SET heartbeat_at = -1",),
    "text heartbeat": ("UPDATE leases SET heartbeat_at = 'soon'",),
    "negative enqueue time": ("UPDATE turn_requests SET enqueued_at = -5",),
    "multi-line session id": ("UPDATE turn_requests SET session_id = 'session\n1'",),
    "zero generation everywhere": (
        "UPDATE leases SET generation = 0",
        "UPDATE turn_requests SET lease_generation = 0",
        f"UPDATE {IDENTITY} SET lease_generation = 0",
    ),
    "lease without its request": ("DELETE FROM turn_payloads", "DELETE FROM turn_requests"),
    "partial identity": (
        f"CREATE TABLE loose AS SELECT * FROM {IDENTITY}",
        f"DROP TABLE {IDENTITY}",
        f"ALTER TABLE loose RENAME TO {IDENTITY}",
        f"UPDATE {IDENTITY} SET child_session = NULL",
    ),
}


#: Corruptions PostgreSQL cannot hold, with the reason.
SQLITE_ONLY_CORRUPTIONS = {
    "child start ticks as a blob": "a text column of PostgreSQL cannot hold a blob",
    "text heartbeat": "a bigint column of PostgreSQL refuses text",
    "partial identity": "rebuilds the table without its constraints (would change the shared schema)",
}


@pytest.mark.parametrize(
    "corruption",
    cases_with_sqlite_only(CORRUPTIONS, SQLITE_ONLY_CORRUPTIONS),
)
def test_corrupt_durable_row_fails_the_whole_listing(plane: AdmissionPlane, database_url: str, corruption: str) -> None:
    """Any untrustworthy lease, request or identity row makes list_recoverable_dispatches raise an error that names
    nothing."""
    lease_in_phase(plane, "dispatch_intent", now=100)
    execute(database_url, *CORRUPTIONS[corruption], foreign_keys=False)
    with pytest.raises(RecoverableDispatchInventoryError, match=INVALID_ROW):
        plane.list_recoverable_dispatches()


@pytest.mark.parametrize(
    "statement",
    ["UPDATE leases SET owner_instance_id = ' padded'", "UPDATE leases SET lease_id = ''"],
    ids=["padded lease owner", "empty lease id"],
)
def test_invalid_identifier_on_a_lease_without_identity_fails_the_listing(
    plane: AdmissionPlane, database_url: str, statement: str
) -> None:
    """An invalid identifier on a lease fails the listing even when the lease has no identity row."""
    lease_in_phase(plane, "dispatch_intent", now=100, identity=False)
    execute(database_url, statement, foreign_keys=False)
    with pytest.raises(RecoverableDispatchInventoryError, match=INVALID_ROW):
        plane.list_recoverable_dispatches()


def test_one_corrupt_row_hides_every_valid_row(plane: AdmissionPlane, database_url: str) -> None:
    """The listing is all or nothing, so a corrupt second lease fails it although the first is valid."""
    activate(plane, lease_in_phase(plane, "admitted", request_id="r-good", now=100), 200)
    lease_in_phase(plane, "dispatch_intent", request_id="r-bad", now=300)
    execute(database_url, "UPDATE lease_process_identities SET child_pid = 0 WHERE request_id = 'r-bad'")
    with pytest.raises(RecoverableDispatchInventoryError):
        plane.list_recoverable_dispatches()


# --- list_recoverable_queued_owners ----------------------------------------------------------------------


def test_queued_owners_list_each_bound_queued_request_with_its_owner(plane: AdmissionPlane) -> None:
    """list_recoverable_queued_owners lists each queued request bound to an owner with the owner's full identity, oldest
    first."""
    other = connector(4_321, owner=OWNER_B)
    enqueue(plane, "r-2", now=2_000)
    enqueue(plane, "r-1", now=2_000, owner_identity=other)
    enqueue(plane, "r-0", now=1_000)
    assert without_host(plane.list_recoverable_queued_owners()) == (
        RecoverableQueuedOwner("r-0", plane.owner_identity),
        RecoverableQueuedOwner("r-1", other),
        RecoverableQueuedOwner("r-2", plane.owner_identity),
    )


def test_queued_owners_skip_requests_that_are_no_longer_queued(plane: AdmissionPlane) -> None:
    """Admitted and cancelled requests are no longer listed as queued owners."""
    lease_in_phase(plane, "admitted", request_id="r-admitted", now=100)
    enqueue(plane, "r-cancelled", now=200)
    plane.cancel_queued("r-cancelled", 300)
    enqueue(plane, "r-queued", now=400)
    assert [entry.request_id for entry in plane.list_recoverable_queued_owners()] == ["r-queued"]


def test_queued_request_without_a_binding_is_not_listed(plane: AdmissionPlane, database_url: str) -> None:
    """A queued request with no owner binding, as an older connector wrote it, is not listed."""
    enqueue(plane, "r1", now=100)
    execute(database_url, "UPDATE turn_requests SET queued_owner_instance_id = NULL, queued_owner_recorded_at = NULL")
    assert plane.list_recoverable_queued_owners() == ()


OWNER_CORRUPTIONS: dict[str, tuple[str, ...]] = {
    "pid 0": ("UPDATE queued_owner_instances SET pid = 0",),
    "all-zero boot id": ("UPDATE queued_owner_instances SET boot_id = '00000000-0000-0000-0000-000000000000'",),
    "created at with offset": ("UPDATE queued_owner_instances SET created_at = '2023-11-14T22:13:20.000+00:00'",),
    "start ticks with leading zero": ("UPDATE queued_owner_instances SET start_time_ticks = '0' || start_time_ticks",),
    "non-UUID owner": (
        "UPDATE queued_owner_instances SET owner_instance_id = 'owner-1'",
        "UPDATE turn_requests SET queued_owner_instance_id = 'owner-1'",
    ),
}


@pytest.mark.parametrize("corruption", OWNER_CORRUPTIONS)
def test_corrupt_queued_owner_row_fails_the_listing(plane: AdmissionPlane, database_url: str, corruption: str) -> None:
    """An owner row that is not a valid connector identity makes list_recoverable_queued_owners raise
    RecoverableDispatchInventoryError."""
    enqueue(plane, "r1", now=100)
    execute(database_url, *OWNER_CORRUPTIONS[corruption], foreign_keys=False)
    with pytest.raises(RecoverableDispatchInventoryError, match=INVALID_ROW):
        plane.list_recoverable_queued_owners()
