"""Enqueue, idempotency, conflicts, payload persistence and queued-owner binding."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from dbutil import (
    columns,
    count,
    event_kinds,
    exactly,
    journal_fault,
    query,
    request_state,
    table_dump,
)
from planes import UUID_V4, PlaneFactory, admit, enqueue

from admission_plane import (
    AdmissionConflictError,
    AdmissionDatabaseError,
    AdmissionPlane,
    AdmissionStateError,
    ConnectorIdentity,
    InvalidInputError,
    PayloadConflictError,
    UnknownRequestError,
)

META = {
    "session_id": "session-1",
    "agent_id": "agent-a",
    "fingerprint": "fingerprint-1",
    "provider": "antigravity",
    "model": "model-test",
}
NOT_QUEUED = "request is no longer queued"
CONFLICT = "request identity was reused with different immutable metadata"
PAYLOAD_CONFLICT = "request already has a different durable payload"
BAD_EXPIRY = "payload expiry must be after persistence time"
OWNER_COLUMNS = (
    "owner_instance_id, created_at, boot_id, pid, start_time_ticks, pid_namespace_inode, ppid, pgrp,"
    " session, recorded_at"
)


def bare(plane: AdmissionPlane, request_id: str, now: int = 0, **overrides: Any):
    """``enqueue`` without a payload (metadata only)."""
    return plane.enqueue(**{"request_id": request_id, **META, "now": now, **overrides})


def request_row(path: str, request_id: str) -> dict[str, Any]:
    rows = query(
        path,
        "SELECT state, agent_id, enqueued_at, deadline_at, lease_generation, terminal_at, queued_owner_instance_id,"
        " queued_owner_recorded_at FROM turn_requests WHERE request_id = ?",
        (request_id,),
    )
    assert len(rows) == 1
    keys = ("state", "agent_id", "enqueued_at", "deadline_at", "lease_generation", "terminal_at", "owner", "owner_at")
    return dict(zip(keys, rows[0], strict=True))


def time_out(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    assert plane.admit_next(plane.policy.queue_timeout_ms, "sweeper") is None


def cancel(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    plane.cancel_queued(request_id, 1)


def admitted(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    assert admit(plane, 1).request_id == request_id


# --- a new request ----------------------------------------------------------------------------


def test_new_request_is_queued_with_deadline_and_generation_zero(plane: AdmissionPlane, database_url: str) -> None:
    """The first enqueue returns existed=False and stores a queued row with deadline now + queue timeout and lease
    generation 0."""
    assert enqueue(plane, "new", "agent-x", now=0).existed is False
    row = request_row(database_url, "new")
    assert {
        key: row[key] for key in ("state", "agent_id", "enqueued_at", "deadline_at", "lease_generation", "terminal_at")
    } == {
        "state": "queued",
        "agent_id": "agent-x",
        "enqueued_at": 0,
        "deadline_at": 1_800_000,
        "lease_generation": 0,
        "terminal_at": None,
    }


def test_new_request_journals_one_enqueued_event_at_now(plane: AdmissionPlane, database_url: str) -> None:
    """A new request journals exactly one absent-to-queued request_enqueued event at the caller's now."""
    enqueue(plane, "new", now=4_242)
    assert query(database_url, "SELECT kind, from_state, to_state, occurred_at FROM events") == [
        ("request_enqueued", "absent", "queued", 4_242)
    ]


def test_metadata_only_enqueue_returns_a_new_request_without_payload(plane: AdmissionPlane, database_url: str) -> None:
    """A plain enqueue creates the same queued row and event as an enqueue with payload, but no payload row."""
    result = bare(plane, "bare", now=7)
    assert (result.request_id, result.existed) == ("bare", False)
    assert request_row(database_url, "bare")["deadline_at"] == 7 + 1_800_000
    assert event_kinds(database_url) == [("request_enqueued", "absent", "queued")]
    assert count(database_url, "turn_payloads") == 0


# --- replay and conflicts ---------------------------------------------------------------------------


def test_identical_replay_is_idempotent_and_ignores_now(plane: AdmissionPlane, database_url: str) -> None:
    """Re-enqueueing identical metadata, even at another now, returns existed=True and changes nothing."""
    enqueue(plane, "replayed", now=0)
    before = table_dump(database_url)
    assert enqueue(plane, "replayed", now=0).existed is True
    assert bare(plane, "replayed", now=500).existed is True
    assert table_dump(database_url) == before


@pytest.mark.parametrize("field", ["session_id", "agent_id", "fingerprint", "provider", "model"])
def test_reusing_a_request_id_with_any_different_immutable_field_is_a_conflict(
    plane: AdmissionPlane, database_url: str, field: str
) -> None:
    """Re-enqueueing a request id with any of its five immutable fields changed raises AdmissionConflictError and leaves
    the row untouched."""
    bare(plane, "conflicted-request-id")
    before = table_dump(database_url)
    with pytest.raises(AdmissionConflictError, match=exactly(CONFLICT)) as raised:
        bare(plane, "conflicted-request-id", **{field: "changed"})
    assert "conflicted-request-id" not in str(raised.value)
    assert table_dump(database_url) == before


def test_payload_enqueue_with_different_metadata_is_a_conflict(plane: AdmissionPlane, database_url: str) -> None:
    """enqueue_with_payload checks the same immutable fields, and raises the conflict, before touching the payload."""
    enqueue(plane, "conflicted", now=0)
    before = table_dump(database_url)
    with pytest.raises(AdmissionConflictError, match=exactly(CONFLICT)):
        enqueue(plane, "conflicted", now=0, model="other-model")
    assert table_dump(database_url) == before


# --- agent_id is the only owner spelling ----------------------------------------------------------


def test_parent_id_is_not_an_accepted_spelling(plane: AdmissionPlane, database_url: str) -> None:
    """The enqueue API has no parent_id parameter, so passing one fails before any write."""
    before = table_dump(database_url)
    with pytest.raises(TypeError, match="parent_id"):
        plane.enqueue(request_id="r", **META, now=0, parent_id="agent-a")  # type: ignore[call-arg]
    assert table_dump(database_url) == before


def test_agent_id_is_stored_in_the_agent_id_column_and_parent_id_is_gone(
    plane: AdmissionPlane, database_url: str
) -> None:
    """agent_id is stored in turn_requests.agent_id and returned by get_request, and no parent_id column exists."""
    bare(plane, "agent-spelling", agent_id="agent-z")
    stored = plane.get_request("agent-spelling")
    assert stored is not None
    assert stored.agent_id == "agent-z"
    assert query(database_url, "SELECT agent_id FROM turn_requests") == [("agent-z",)]
    assert "agent_id" in columns(database_url, "turn_requests")
    assert "parent_id" not in columns(database_url, "turn_requests")


# --- metadata validation before any write --------------------------------------------------------------

BAD_TEXT = [None, 5, b"bytes", "", "   ", "\t\n", "nul\0inside"]


@pytest.mark.parametrize("field", ["request_id", "session_id", "fingerprint", "provider", "model"])
@pytest.mark.parametrize("value", BAD_TEXT, ids=repr)
def test_invalid_text_metadata_is_refused_before_any_write(
    plane: AdmissionPlane, database_url: str, field: str, value: object
) -> None:
    """A non-string, blank or NUL-carrying text field is refused with `invalid request metadata <field>` before any
    write."""
    fields = {"request_id": "valid-id", **META, field: value}
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(f"invalid request metadata {field}")):
        plane.enqueue(**fields, now=0)
    with pytest.raises(InvalidInputError, match=exactly(f"invalid request metadata {field}")):
        plane.enqueue_with_payload(**fields, now=0, plaintext="p", expires_at=10)
    assert table_dump(database_url) == before


@pytest.mark.parametrize("value", [None, 5, b"agent"], ids=repr)
def test_non_string_agent_id_is_invalid_request_metadata(
    plane: AdmissionPlane, database_url: str, value: object
) -> None:
    """A missing or non-string agent_id is refused with `invalid request metadata agent_id`."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly("invalid request metadata agent_id")):
        bare(plane, "r", agent_id=value)
    assert table_dump(database_url) == before


@pytest.mark.parametrize("value", ["", "a" * 257, " agent", "agent ", "age\nnt", "agent\x7f", "a\x00b"], ids=repr)
def test_agent_id_must_be_a_single_line_identifier(plane: AdmissionPlane, database_url: str, value: str) -> None:
    """An empty, over-long, padded or control-carrying agent_id is refused with the single-line identifier message."""
    before = table_dump(database_url)
    with pytest.raises(
        InvalidInputError, match=exactly("request metadata agent_id must be a non-empty single-line identifier")
    ):
        bare(plane, "r", agent_id=value)
    assert table_dump(database_url) == before


def test_agent_id_of_exactly_256_characters_is_accepted(plane: AdmissionPlane, database_url: str) -> None:
    """An agent_id of exactly 256 characters, the identifier limit itself, is accepted."""
    assert bare(plane, "r", agent_id="a" * 256).existed is False


@pytest.mark.parametrize("now", [-1, 1.5, float("nan"), float("inf"), True, "0", None, 2**53], ids=repr)
def test_enqueue_timestamp_must_be_a_non_negative_safe_integer(
    plane: AdmissionPlane, database_url: str, now: object
) -> None:
    """A negative, fractional, non-finite or non-integer now is refused with `invalid request timestamp` and writes
    nothing."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly("invalid request timestamp")):
        bare(plane, "r", now=now)
    assert table_dump(database_url) == before


def test_non_finite_now_on_payload_enqueue_is_caught_by_the_expiry_check(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Through enqueue_with_payload, a NaN now is refused first by the payload expiry check."""
    with pytest.raises(InvalidInputError, match=exactly(BAD_EXPIRY)):
        enqueue(plane, "r", now=float("nan"), expires_at=10)  # type: ignore[arg-type]
    assert count(database_url, "turn_requests") == 0


@pytest.mark.parametrize("request_id", [" padded", "padded ", "line\nbreak", "tab\there", "x" * 257], ids=repr)
def test_request_id_that_is_not_an_identifier_is_refused_before_any_write(
    plane: AdmissionPlane, database_url: str, request_id: str
) -> None:
    """A request id that is not a single-line identifier of at most 256 characters is refused and nothing is written."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=r"must be a non-empty single-line identifier$"):
        enqueue(plane, request_id, now=0)
    assert table_dump(database_url) == before


def test_request_id_identifier_failure_uses_the_seed_message(plane: AdmissionPlane) -> None:
    """A request id that is not an identifier is reported with the journal's `event correlation input ...` message, as
    the original connector reports it."""
    with pytest.raises(
        InvalidInputError, match=exactly("event correlation input must be a non-empty single-line identifier")
    ):
        enqueue(plane, " padded", now=0)


# --- no identifiers in errors --------------------------------------------------------------------------


def test_re_enqueue_after_timeout_reads_exactly_request_is_no_longer_queued(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Re-enqueueing a timed-out request fails with exactly `request is no longer queued`, naming no identifier, and
    changes nothing."""
    time_out(plane, "timed-out")
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError) as raised:
        bare(plane, "timed-out")
    assert str(raised.value) == NOT_QUEUED
    assert table_dump(database_url) == before


# --- metadata-only requests are invisible ------------------------------------------------------------


def test_metadata_only_request_is_never_admitted_or_reported(plane: AdmissionPlane, database_url: str) -> None:
    """Without a payload, admit_next and admit_request never select the request and its queue snapshot is None."""
    bare(plane, "bare", now=0)
    owner = plane.owner_identity.owner_instance_id
    assert plane.admit_next(10, owner) is None
    assert plane.admit_request("bare", 10, owner) is None
    assert plane.get_queue_snapshot("bare", 10) is None
    assert request_state(database_url, "bare") == "queued"
    assert count(database_url, "leases") == 0


def test_metadata_only_request_still_times_out(plane: AdmissionPlane, database_url: str) -> None:
    """A request without a payload still times out at its deadline."""
    bare(plane, "bare", now=0)
    assert plane.admit_next(1_800_000, "owner") is None
    assert request_state(database_url, "bare") == "queue_timeout"
    assert event_kinds(database_url)[-1] == ("request_queue_timed_out", "queued", "queue_timeout")


def test_persisting_a_payload_makes_a_metadata_only_request_eligible(plane: AdmissionPlane) -> None:
    """persist_payload makes a request that had no payload the next one admitted."""
    bare(plane, "bare", now=0)
    plane.persist_payload("bare", "late prompt", 5, 10_000)
    assert admit(plane, 10).request_id == "bare"


# --- atomic payload enqueue -----------------------------------------------------------------------------


def test_payload_enqueue_replay_with_the_same_prompt_is_idempotent(plane: AdmissionPlane, database_url: str) -> None:
    """Re-enqueueing the same request with the same prompt returns existed=True and rewrites nothing."""
    assert enqueue(plane, "atomic", plaintext="prompt-a").existed is False
    before = table_dump(database_url)
    assert enqueue(plane, "atomic", plaintext="prompt-a").existed is True
    assert table_dump(database_url) == before


def test_payload_enqueue_with_a_different_prompt_conflicts_and_keeps_the_ciphertext(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Re-enqueueing with a different prompt raises PayloadConflictError, naming no identifier, and leaves the stored
    payload unchanged."""
    enqueue(plane, "atomic-payload-id", plaintext="prompt-a")
    before = table_dump(database_url)
    with pytest.raises(PayloadConflictError, match=exactly(PAYLOAD_CONFLICT)) as raised:
        enqueue(plane, "atomic-payload-id", plaintext="prompt-b")
    assert "atomic-payload-id" not in str(raised.value)
    assert table_dump(database_url) == before


def test_request_stays_admissible_with_its_first_prompt_after_a_payload_conflict(plane: AdmissionPlane) -> None:
    """After a payload conflict the request is still admitted and reads back its first prompt."""
    enqueue(plane, "atomic", plaintext="prompt-a", now=0)
    with pytest.raises(PayloadConflictError):
        enqueue(plane, "atomic", plaintext="prompt-b", now=0)
    assert admit(plane, 1).request_id == "atomic"
    assert plane.read_payload("atomic", 2) == "prompt-a"


def test_first_payload_for_an_existing_metadata_only_request_reports_existed(
    plane: AdmissionPlane, database_url: str
) -> None:
    """enqueue_with_payload for a request that already existed without a payload returns existed=True and stores the
    payload."""
    bare(plane, "bare", now=0)
    assert enqueue(plane, "bare", now=0).existed is True
    assert count(database_url, "turn_payloads", "request_id = 'bare'") == 1
    assert len(event_kinds(database_url)) == 1


# --- only queued requests take payloads ---------------------------------------------------------------

NOT_QUEUED_STATES: dict[str, Callable[[AdmissionPlane, str], None]] = {
    "admitted": admitted,
    "queue_timeout": time_out,
    "cancelled": cancel,
}
ENTRY_POINTS: dict[str, Callable[[AdmissionPlane, str], object]] = {
    "enqueue": lambda plane, request_id: bare(plane, request_id, now=2),
    "enqueue_with_payload": lambda plane, request_id: enqueue(plane, request_id, now=2),
    "persist_payload": lambda plane, request_id: plane.persist_payload(request_id, f"prompt for {request_id}", 2, 99),
}


@pytest.mark.parametrize("state", NOT_QUEUED_STATES)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_requests_that_left_the_queue_take_no_payload(
    plane: AdmissionPlane, database_url: str, state: str, entry: str
) -> None:
    """enqueue, enqueue_with_payload and persist_payload on a request that is no longer queued fail and change
    nothing."""
    NOT_QUEUED_STATES[state](plane, "left")
    assert request_state(database_url, "left") == state
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly(NOT_QUEUED)):
        ENTRY_POINTS[entry](plane, "left")
    assert table_dump(database_url) == before


# --- persist_payload ----------------------------------------------------------------------------------------


def test_persist_payload_for_an_unknown_request_fails(plane: AdmissionPlane, database_url: str) -> None:
    """persist_payload for an unknown request id raises `unknown request` and writes nothing."""
    before = table_dump(database_url)
    with pytest.raises(UnknownRequestError, match=exactly("unknown request")):
        plane.persist_payload("ghost", "prompt", 0, 10)
    assert table_dump(database_url) == before


def test_persist_payload_writes_one_payload_row_and_no_event(plane: AdmissionPlane, database_url: str) -> None:
    """persist_payload inserts one sealed payload row and journals nothing."""
    bare(plane, "bare", now=0)
    plane.persist_payload("bare", "prompt", 3, 10)
    assert query(database_url, "SELECT key_version, expires_at, created_at FROM turn_payloads") == [(1, 10, 3)]
    assert len(event_kinds(database_url)) == 1


def test_persist_payload_with_the_same_content_twice_is_a_no_op(plane: AdmissionPlane, database_url: str) -> None:
    """Persisting the same prompt again, even with another expiry, leaves the database unchanged."""
    bare(plane, "bare", now=0)
    plane.persist_payload("bare", "prompt", 0, 10)
    before = table_dump(database_url)
    plane.persist_payload("bare", "prompt", 5, 50)
    assert table_dump(database_url) == before


def test_persist_payload_with_different_content_conflicts(plane: AdmissionPlane, database_url: str) -> None:
    """Persisting a different prompt raises PayloadConflictError and keeps the first payload."""
    bare(plane, "bare", now=0)
    plane.persist_payload("bare", "prompt", 0, 10)
    before = table_dump(database_url)
    with pytest.raises(PayloadConflictError, match=exactly(PAYLOAD_CONFLICT)):
        plane.persist_payload("bare", "other prompt", 0, 10)
    assert table_dump(database_url) == before


# --- the expiry argument -----------------------------------------------------------------------------------

BAD_EXPIRIES = [(10, 10), (10, 9), (10, float("nan")), (10, float("inf")), (float("inf"), 10)]


@pytest.mark.parametrize(("now", "expires_at"), BAD_EXPIRIES, ids=repr)
def test_payload_expiry_must_be_after_persistence_time(
    make_plane: PlaneFactory, database_url: str, now: object, expires_at: object
) -> None:
    """An expires_at not after now, or a non-finite one, is refused before any work, even before missing keys are
    noticed."""
    bare(make_plane(), "bare", now=0)
    keyless = make_plane(encryption_key=None, content_fingerprint_key=None)
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly(BAD_EXPIRY)):
        keyless.enqueue_with_payload(request_id="new", **META, now=now, plaintext="p", expires_at=expires_at)
    with pytest.raises(InvalidInputError, match=exactly(BAD_EXPIRY)):
        keyless.persist_payload("bare", "p", now, expires_at)
    assert table_dump(database_url) == before


# --- queued-owner binding --------------------------------------------------------------------------------


def test_enqueue_binds_the_request_to_the_planes_own_identity(plane: AdmissionPlane, database_url: str) -> None:
    """An enqueue binds the request to the plane's lowercase UUIDv4 owner id at the enqueue now and records one owner
    row."""
    enqueue(plane, "bound", now=1_234)
    owner = plane.owner_identity
    row = request_row(database_url, "bound")
    assert (row["owner"], row["owner_at"]) == (owner.owner_instance_id, 1_234)
    process = owner.process
    assert query(database_url, f"SELECT {OWNER_COLUMNS} FROM queued_owner_instances") == [
        (
            owner.owner_instance_id,
            owner.created_at,
            process.boot_id,
            process.pid,
            process.start_time_ticks,
            process.pid_namespace_inode,
            process.ppid,
            process.pgrp,
            process.session,
            1_234,
        )
    ]
    assert re.fullmatch(UUID_V4, row["owner"])


def test_one_owner_row_serves_every_request_the_plane_enqueues(plane: AdmissionPlane, database_url: str) -> None:
    """A plane's owner identity is recorded once, however many requests it binds."""
    enqueue(plane, "first", now=1)
    bare(plane, "second", now=2)
    assert count(database_url, "queued_owner_instances") == 1
    assert {row[0] for row in query(database_url, "SELECT queued_owner_instance_id FROM turn_requests")} == {
        plane.owner_identity.owner_instance_id
    }


def test_enqueue_binds_to_an_explicit_owner_identity(plane: AdmissionPlane, database_url: str) -> None:
    """An explicit owner_identity argument replaces the plane's own identity as the request's queued owner."""
    other = ConnectorIdentity.capture(owner_instance_id="0b0e7f3e-8c4a-4d2b-9f1e-2a3b4c5d6e7f", now=0)
    bare(plane, "bound", now=9, owner_identity=other)
    assert request_row(database_url, "bound")["owner"] == other.owner_instance_id
    assert query(database_url, "SELECT owner_instance_id, recorded_at FROM queued_owner_instances") == [
        (other.owner_instance_id, 9)
    ]


def with_process(owner: ConnectorIdentity, **changes: Any) -> ConnectorIdentity:
    return attrs.evolve(owner, process=attrs.evolve(owner.process, **changes))


OWNER_CHANGES: dict[str, Callable[[ConnectorIdentity], ConnectorIdentity]] = {
    "created_at": lambda o: attrs.evolve(o, created_at="2001-02-03T04:05:06.789Z"),
    "boot_id": lambda o: with_process(o, boot_id="0123abcd-0000-4000-8000-00000000beef"),
    "pid": lambda o: with_process(o, pid=o.process.pid + 1),
    "start_time_ticks": lambda o: with_process(o, start_time_ticks=str(int(o.process.start_time_ticks) + 1)),
    "pid_namespace_inode": lambda o: with_process(o, pid_namespace_inode=o.process.pid_namespace_inode + 1),
    "ppid": lambda o: with_process(o, ppid=o.process.ppid + 1),
    "pgrp": lambda o: with_process(o, pgrp=o.process.pgrp + 1),
    "session": lambda o: with_process(o, session=o.process.session + 1),
}


@pytest.mark.parametrize("field", OWNER_CHANGES)
def test_same_owner_id_with_a_different_identity_field_is_a_conflict(
    plane: AdmissionPlane, database_url: str, field: str
) -> None:
    """Presenting a known owner id with any identity field changed raises AdmissionConflictError and writes nothing."""
    enqueue(plane, "first", now=0)
    changed = OWNER_CHANGES[field](plane.owner_identity)
    before = table_dump(database_url)
    with pytest.raises(AdmissionConflictError, match=exactly(CONFLICT)):
        enqueue(plane, "second", now=1, owner_identity=changed)
    with pytest.raises(AdmissionConflictError, match=exactly(CONFLICT)):
        enqueue(plane, "first", now=1, owner_identity=changed)
    assert table_dump(database_url) == before


def test_a_different_owner_re_enqueuing_keeps_the_first_binding(make_plane: PlaneFactory, database_url: str) -> None:
    """Another connector re-enqueueing an existing queued request is idempotent and keeps the first owner binding."""
    first, second = make_plane(), make_plane()
    enqueue(first, "shared", now=0)
    assert enqueue(second, "shared", now=5).existed is True
    assert request_row(database_url, "shared")["owner"] == first.owner_identity.owner_instance_id
    assert request_row(database_url, "shared")["owner_at"] == 0


def test_malformed_owner_identity_is_refused_before_any_write(plane: AdmissionPlane, database_url: str) -> None:
    """An owner identity that is not a ConnectorIdentity is refused and nothing is written."""
    before = table_dump(database_url)
    with pytest.raises(InvalidInputError, match=exactly("owner identity must be a ConnectorIdentity")):
        enqueue(plane, "r", owner_identity=plane.owner_identity.to_mapping())
    assert table_dump(database_url) == before


# --- a journal fault rolls the enqueue back ----------------------------------------------------------------


def test_journal_fault_rolls_the_whole_enqueue_back(plane: AdmissionPlane, database_url: str) -> None:
    """When the event insert aborts, the caller sees the database error and no request, payload or event remains."""
    before = table_dump(database_url)
    with journal_fault(database_url), pytest.raises(AdmissionDatabaseError, match="journal fault injected"):
        enqueue(plane, "faulted", now=0)
    assert table_dump(database_url) == before
    assert [count(database_url, table) for table in ("turn_requests", "turn_payloads", "events")] == [0, 0, 0]


def test_enqueue_succeeds_once_the_journal_fault_is_removed(plane: AdmissionPlane, database_url: str) -> None:
    """Once the aborting trigger is dropped, the same enqueue succeeds as a new request."""
    with journal_fault(database_url), pytest.raises(AdmissionDatabaseError):
        enqueue(plane, "faulted", now=0)
    assert enqueue(plane, "faulted", now=0).existed is False
    assert plane.read_payload("faulted", 1) == "prompt for faulted"
