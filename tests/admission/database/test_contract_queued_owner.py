"""Settling the queued requests of a dead owner."""

from __future__ import annotations

import pytest
from dbutil import count, event_kinds, exactly, execute, query, table_dump
from fake_proc import OWNER_B, connector
from planes import enqueue, lease_in_phase

from admission_plane import AdmissionPlane, AdmissionStateError, InvalidInputError

DEAD = connector(4_321, owner=OWNER_B)


@pytest.fixture
def queued(plane: AdmissionPlane) -> AdmissionPlane:
    """A plane with r1 queued by the (soon dead) owner DEAD at 100."""
    enqueue(plane, "r1", now=100, owner_identity=DEAD)
    return plane


def test_settle_cancels_the_queued_request_of_its_dead_owner(queued: AdmissionPlane, database_url: str) -> None:
    """settle_queued_owner_death returns True, cancels the dead owner's queued request at now and deletes its
    payload."""
    assert queued.settle_queued_owner_death("r1", OWNER_B, 5_000) is True
    assert query(database_url, "SELECT state, terminal_at FROM turn_requests") == [("cancelled", 5_000)]
    assert count(database_url, "turn_payloads") == 0


def test_settle_journals_one_queued_owner_dead_event(queued: AdmissionPlane, database_url: str) -> None:
    """Settling journals exactly one queued-to-cancelled queued_owner_dead event at now."""
    queued.settle_queued_owner_death("r1", OWNER_B, 5_000)
    assert query(
        database_url, "SELECT kind, from_state, to_state, occurred_at FROM events WHERE kind != 'request_enqueued'"
    ) == [("queued_owner_dead", "queued", "cancelled", 5_000)]


def test_settle_keeps_the_owner_binding_and_the_owner_row(queued: AdmissionPlane, database_url: str) -> None:
    """Settling keeps the request's owner binding columns and the queued owner row."""
    binding = query(database_url, "SELECT queued_owner_instance_id, queued_owner_recorded_at FROM turn_requests")
    owners = query(database_url, "SELECT * FROM queued_owner_instances")
    queued.settle_queued_owner_death("r1", OWNER_B, 5_000)
    assert binding == [(OWNER_B, 100)]
    binding_columns = "SELECT queued_owner_instance_id, queued_owner_recorded_at FROM turn_requests"
    assert query(database_url, binding_columns) == binding
    assert query(database_url, "SELECT * FROM queued_owner_instances") == owners


def test_second_settlement_returns_false_and_writes_nothing(queued: AdmissionPlane, database_url: str) -> None:
    """Settling an already settled request returns False and writes nothing."""
    queued.settle_queued_owner_death("r1", OWNER_B, 5_000)
    before = table_dump(database_url)
    assert queued.settle_queued_owner_death("r1", OWNER_B, 6_000) is False
    assert table_dump(database_url) == before


def test_settlement_for_another_owner_returns_false(queued: AdmissionPlane, database_url: str) -> None:
    """An owner that did not enqueue the request cannot settle it: the call returns False and writes nothing."""
    before = table_dump(database_url)
    assert queued.settle_queued_owner_death("r1", queued.owner_identity.owner_instance_id, 5_000) is False
    assert table_dump(database_url) == before


def test_settlement_of_an_unknown_request_returns_false(queued: AdmissionPlane, database_url: str) -> None:
    """Settling a request id that does not exist returns False and writes nothing."""
    before = table_dump(database_url)
    assert queued.settle_queued_owner_death("r-missing", OWNER_B, 5_000) is False
    assert table_dump(database_url) == before


def test_settlement_of_an_admitted_request_returns_false(plane: AdmissionPlane, database_url: str) -> None:
    """Settling an admitted request returns False and writes nothing, since it is no longer queued."""
    lease_in_phase(plane, "admitted", now=100)
    owner = plane.owner_identity.owner_instance_id
    before = table_dump(database_url)
    assert plane.settle_queued_owner_death("r1", owner, 5_000) is False
    assert table_dump(database_url) == before


def test_settlement_of_a_cancelled_request_returns_false(queued: AdmissionPlane, database_url: str) -> None:
    """Settling a request its owner already cancelled returns False and writes nothing."""
    queued.cancel_queued("r1", 200)
    before = table_dump(database_url)
    assert queued.settle_queued_owner_death("r1", OWNER_B, 5_000) is False
    assert table_dump(database_url) == before


def test_settlement_returns_false_while_any_lease_exists(plane: AdmissionPlane, database_url: str) -> None:
    """A request that looks queued but still has a lease row is never settled."""
    lease_in_phase(plane, "admitted", now=100)
    execute(database_url, "UPDATE turn_requests SET state = 'queued'")
    before = table_dump(database_url)
    assert plane.settle_queued_owner_death("r1", plane.owner_identity.owner_instance_id, 5_000) is False
    assert table_dump(database_url) == before


def test_dead_owners_request_stops_blocking_the_queue_head(queued: AdmissionPlane) -> None:
    """After settlement the next request is admitted and the dead owner's prompt can no longer be read."""
    enqueue(queued, "r2", agent_id="agent-b", now=200)
    queued.settle_queued_owner_death("r1", OWNER_B, 5_000)
    admitted = queued.admit_next(5_001, queued.owner_identity.owner_instance_id)
    assert admitted is not None
    assert admitted.request_id == "r2"
    with pytest.raises(AdmissionStateError, match=exactly("no payload is available")):
        queued.read_payload("r1", 5_002)


def test_settled_request_leaves_the_queued_owner_inventory(queued: AdmissionPlane) -> None:
    """A settled request is no longer listed among the recoverable queued owners."""
    queued.settle_queued_owner_death("r1", OWNER_B, 5_000)
    assert queued.list_recoverable_queued_owners() == ()


@pytest.mark.parametrize(
    ("request_id", "owner", "now", "message"),
    [
        ("", OWNER_B, 5_000, "queued owner request ID must be a non-empty single-line identifier"),
        ("r1\n", OWNER_B, 5_000, "queued owner request ID must be a non-empty single-line identifier"),
        ("r1", " padded", 5_000, "queued owner instance ID must be a non-empty single-line identifier"),
        ("r1", None, 5_000, "queued owner instance ID must be a non-empty single-line identifier"),
        ("r1", OWNER_B, -1, "queued owner death timestamp must be a non-negative safe integer"),
        ("r1", OWNER_B, True, "queued owner death timestamp must be a non-negative safe integer"),
    ],
)
def test_settlement_arguments_are_validated_before_any_write(
    queued: AdmissionPlane, database_url: str, request_id: object, owner: object, now: object, message: str
) -> None:
    """An invalid request id, owner id or time is refused with the original connector's message and nothing is
    written."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(message)):
        queued.settle_queued_owner_death(request_id, owner, now)  # type: ignore[arg-type]
    assert table_dump(database_url) == before
    assert event_kinds(database_url) == [("request_enqueued", "absent", "queued")]
