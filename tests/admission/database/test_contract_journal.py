"""The sanitized events journal: lifecycle order and correlation, paging, page validation,
tamper detection on read and the transition allowlist."""

from __future__ import annotations

import hashlib

import attrs
import pytest
from dbutil import cases_with_sqlite_only, count, exactly, execute, query, table_dump
from planes import admit, enqueue
from sqlalchemy import text

from admission_plane import AdmissionPlane, AdmissionStateError, InvalidInputError, LiveTurnCompletion
from admission_plane.service import _journal
from admission_plane.states import EVENT_STATES, EVENT_TRANSITIONS
from admission_plane.store.tx import Statement

CORRELATION_REQUEST_1 = "dd68e8f75598f7318cac9c6a72bfd6af38522a7d047d63d7d07a6738434ff906"
LIFECYCLE = [
    ("request_enqueued", "absent", "queued", 100),
    ("request_admitted", "queued", "admitted", 101),
    ("request_starting", "admitted", "starting", 102),
    ("request_dispatch_intent", "starting", "dispatch_intent", 103),
    ("request_active", "dispatch_intent", "active", 104),
    ("request_provider_terminal", "active", "provider_terminal", 105),
    ("request_released", "provider_terminal", "completed", 105),
]
SEAT = ["admitted", "starting", "dispatch_intent", "dispatch_ambiguous", "active", "recovery_required"]
CONTRACT_ALLOWLIST = {
    ("request_enqueued", "absent", "queued"),
    ("request_cancelled", "queued", "cancelled"),
    ("queued_owner_dead", "queued", "cancelled"),
    *(
        ("request_abandoned", phase, outcome)
        for phase in ("admitted", "starting", "dispatch_intent")
        for outcome in ("failed", "cancelled")
    ),
    ("request_queue_timed_out", "queued", "queue_timeout"),
    ("request_admitted", "queued", "admitted"),
    ("request_starting", "admitted", "starting"),
    ("request_dispatch_intent", "starting", "dispatch_intent"),
    ("request_active", "dispatch_intent", "active"),
    ("request_dispatch_ambiguous", "dispatch_intent", "dispatch_ambiguous"),
    ("request_provider_terminal", "active", "provider_terminal"),
    *(("request_released", "provider_terminal", outcome) for outcome in ("completed", "failed", "cancelled")),
    *(("request_recovery_required", phase, "recovery_required") for phase in SEAT),
    *(("request_recovery_seat_released", phase, "recovery_required") for phase in SEAT),
    ("policy_drain_completed", "policy_soft_draining_to_1", "policy_steady"),
}
#: Beyond the seed: a holder proved gone before its dispatch intent, the operator's release, an untrusted row,
#: and (policy v2) live policy revisions, pauses and resumes.
BEYOND_THE_SEED = {
    *(("lease_owner_dead", phase, "cancelled") for phase in ("admitted", "starting")),
    *(("operator_seat_released", phase, "cancelled") for phase in ("admitted", "starting")),
    *(("operator_seat_released", phase, "recovery_required") for phase in SEAT[2:]),  # dispatch_intent on
    ("recovery_row_retained", "untrusted", "retained"),
    # Policy v2: a live policy revision (it ends a soft drain in progress), pause and resume by kind of scope.
    ("policy_revised", "policy_steady", "policy_steady"),
    ("policy_revised", "policy_soft_draining_to_1", "policy_steady"),
    *(("admission_paused", "admitting", f"paused_{scope}") for scope in ("all", "lane", "key")),
    *(("admission_resumed", f"paused_{scope}", "admitting") for scope in ("all", "lane", "key")),
    # Budgets: a turn's reservation and how it settled; usage and corrections from outside the plane.
    ("budget_reserved", "uncharged", "reserved"),
    *(("budget_settled", "reserved", state) for state in ("reconciled", "charged", "retained", "refunded")),
    ("budget_usage_recorded", "outside_plane", "external"),
    ("budget_corrected", "outside_plane", "correction"),
}
REQUEST_STATES = {
    "queued",
    "admitted",
    "starting",
    "dispatch_intent",
    "dispatch_ambiguous",
    "active",
    "provider_terminal",
    "completed",
    "failed",
    "cancelled",
    "queue_timeout",
    "recovery_required",
}
NOT_ALLOWLISTED = "sanitized event journal contains a non-allowlisted transition"
BAD_HMAC = "sanitized event journal contains an invalid correlation HMAC"
BAD_SEQ = "sanitized event journal contains an invalid sequence"
BAD_TIME = "sanitized event timestamp must be a non-negative safe integer"


def run_lifecycle(plane: AdmissionPlane) -> None:
    """enqueue -> admit -> start -> dispatch_intent -> active -> complete, at 100..105 (caller's clock throughout)."""
    enqueue(plane, "request-1", now=100)
    lease = admit(plane, 101)
    plane.mark_starting(lease, 102)
    plane.mark_dispatch_intent(lease, 103)
    plane.mark_active(lease, 104)
    plane.complete_live_turn(lease, 105, LiveTurnCompletion("completed"))


def read_all(plane: AdmissionPlane):
    return plane.read_sanitized_events(after_event_seq=0, limit=1000)


# --- lifecycle and one correlation ----------------------------------------------------------------------------


def test_lifecycle_events_come_in_order_with_the_callers_times(plane: AdmissionPlane) -> None:
    """A completed turn journals enqueued, admitted, starting, dispatch_intent, active, provider_terminal and released,
    in order and at the caller's times."""
    run_lifecycle(plane)
    assert [(e.kind, e.from_state, e.to_state, e.occurred_at) for e in read_all(plane)] == LIFECYCLE


def test_lifecycle_events_share_the_seed_correlation_of_the_request_id(
    plane: AdmissionPlane, database_url: str
) -> None:
    """Every event of a request carries the same correlation HMAC of its request id, which is neither its sha256 nor the
    content fingerprint."""
    enqueue(plane, "request-1", now=100)
    [(content_fingerprint,)] = query(database_url, "SELECT content_fingerprint FROM turn_payloads")
    lease = admit(plane, 101)
    plane.mark_starting(lease, 102)
    assert {event.correlation_hmac for event in read_all(plane)} == {CORRELATION_REQUEST_1}
    assert CORRELATION_REQUEST_1 not in (hashlib.sha256(b"request-1").hexdigest(), content_fingerprint)


def test_paging_after_the_last_sequence_continues_seamlessly(plane: AdmissionPlane) -> None:
    """Pages of three, each read after the previous page's last sequence, concatenate to the whole journal."""
    run_lifecycle(plane)
    pages, cursor = [], 0
    while page := plane.read_sanitized_events(after_event_seq=cursor, limit=3):
        pages.append(page)
        cursor = page[-1].event_seq
    assert [len(page) for page in pages] == [3, 3, 1]
    assert tuple(event for page in pages for event in page) == read_all(plane)


def test_sequences_are_strictly_increasing(plane: AdmissionPlane) -> None:
    """Events come back in strictly increasing event_seq order, starting at 1 or above."""
    run_lifecycle(plane)
    sequences = [event.event_seq for event in read_all(plane)]
    assert sequences == sorted(set(sequences))
    assert sequences[0] >= 1


# --- exact page shape --------------------------------------------------------------------------------------------


def test_page_is_a_tuple_of_frozen_events_with_exactly_the_six_fields(plane: AdmissionPlane) -> None:
    """A page is a tuple of frozen events with exactly the fields event_seq, kind, from_state, to_state, occurred_at and
    correlation_hmac."""
    enqueue(plane, "request-1", now=100)
    page = read_all(plane)
    assert isinstance(page, tuple)
    assert [field.name for field in attrs.fields(type(page[0]))] == [
        "event_seq",
        "kind",
        "from_state",
        "to_state",
        "occurred_at",
        "correlation_hmac",
    ]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        page[0].kind = "request_cancelled"  # type: ignore[misc]


def test_page_request_offers_no_lookup_by_request(plane: AdmissionPlane) -> None:
    """read_sanitized_events takes no request id or other extra argument, and no positional one."""
    with pytest.raises(TypeError):
        plane.read_sanitized_events(after_event_seq=0, limit=10, request_id="request-1")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        plane.read_sanitized_events({"afterEventSeq": 0, "limit": 10})  # type: ignore[misc]


@pytest.mark.parametrize("cursor", [-1, 1.5, True, None, "0", 2**53], ids=repr)
def test_page_cursor_must_be_a_non_negative_safe_integer(plane: AdmissionPlane, cursor: object) -> None:
    """An after_event_seq that is not a non-negative safe integer is refused with the original connector's message."""
    with pytest.raises(InvalidInputError, match=exactly("sanitized event cursor must be a non-negative safe integer")):
        plane.read_sanitized_events(after_event_seq=cursor, limit=10)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, 1001, -1, 2.0, True, None, "10"], ids=repr)
def test_page_limit_must_be_between_1_and_1000(plane: AdmissionPlane, limit: object) -> None:
    """A page limit outside 1..1000, or not an integer, is refused with the original connector's message."""
    with pytest.raises(InvalidInputError, match=exactly("sanitized event page limit must be between 1 and 1000")):
        plane.read_sanitized_events(after_event_seq=0, limit=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [1, 1000])
def test_page_limit_bounds_are_inclusive(plane: AdmissionPlane, limit: int) -> None:
    """Page limits of exactly 1 and 1000 are accepted."""
    run_lifecycle(plane)
    assert len(plane.read_sanitized_events(after_event_seq=0, limit=limit)) == min(limit, len(LIFECYCLE))


# --- tamper detection on read ----------------------------------------------------------------------------------------

TAMPERING = {
    "raw_error_detail kind": ("kind = 'raw_error_detail'", NOT_ALLOWLISTED),
    "unknown from state": ("from_state = 'bogus'", NOT_ALLOWLISTED),
    "unknown to state": ("to_state = 'bogus'", NOT_ALLOWLISTED),
    "integer kind": ("kind = 7", NOT_ALLOWLISTED),
    "valid tokens, wrong transition": ("kind = 'request_cancelled'", NOT_ALLOWLISTED),
    "released to queue_timeout": (
        "kind = 'request_released', from_state = 'provider_terminal', to_state = 'queue_timeout'",
        NOT_ALLOWLISTED,
    ),
    "uppercase HMAC": ("correlation_hmac = upper(correlation_hmac)", BAD_HMAC),
    "short HMAC": ("correlation_hmac = substr(correlation_hmac, 2)", BAD_HMAC),
    "non-hex HMAC": ("correlation_hmac = 'g' || substr(correlation_hmac, 2)", BAD_HMAC),
    "HMAC with newline": ("correlation_hmac = substr(correlation_hmac, 2) || '\n'", BAD_HMAC),
    "blob HMAC": ("correlation_hmac = CAST(correlation_hmac AS BLOB)", BAD_HMAC),
    "negative time": ("occurred_at = -1", BAD_TIME),
    "fractional time": ("occurred_at = 1.5", BAD_TIME),
    "text time": ("occurred_at = 'noon'", BAD_TIME),
    "unsafe time": ("occurred_at = 9007199254740992", BAD_TIME),
    "unsafe sequence": ("event_seq = 9007199254740992", BAD_SEQ),
}


#: Tamperings PostgreSQL's typed columns refuse (or round away), with the reason.
SQLITE_ONLY_TAMPERING = {
    "blob HMAC": "a text column of PostgreSQL cannot hold a blob",
    "fractional time": "a bigint column of PostgreSQL rounds 1.5 to an integer",
    "text time": "a bigint column of PostgreSQL refuses text",
}


@pytest.mark.parametrize(
    "case",
    cases_with_sqlite_only(TAMPERING, SQLITE_ONLY_TAMPERING),
)
def test_a_tampered_row_fails_the_whole_read(plane: AdmissionPlane, database_url: str, case: str) -> None:
    """A stored event with a bad kind, state, transition, HMAC, timestamp or sequence makes the read raise."""
    enqueue(plane, "request-1", now=100)
    admit(plane, 101)
    assignment, message = TAMPERING[case]
    execute(database_url, f"UPDATE events SET {assignment} WHERE kind = 'request_admitted'")
    with pytest.raises(AdmissionStateError, match=exactly(message)):
        read_all(plane)


def test_a_tampered_row_yields_no_partial_page(plane: AdmissionPlane, database_url: str) -> None:
    """A page containing a tampered event fails as a whole, while pages that stop before it or start after it still
    read."""
    run_lifecycle(plane)
    third = query(database_url, "SELECT event_seq FROM events ORDER BY event_seq LIMIT 1 OFFSET 2")[0][0]
    execute(database_url, "UPDATE events SET kind = 'raw_error_detail' WHERE event_seq = ?", params=(third,))
    with pytest.raises(AdmissionStateError, match=exactly(NOT_ALLOWLISTED)):
        plane.read_sanitized_events(after_event_seq=0, limit=3)
    assert len(plane.read_sanitized_events(after_event_seq=0, limit=2)) == 2
    assert len(plane.read_sanitized_events(after_event_seq=third, limit=10)) == len(LIFECYCLE) - 3


# --- the allowlist ----------------------------------------------------------------------------------------------------


def test_the_allowlist_is_exactly_the_contracts_set() -> None:
    """The journal's transition allowlist is exactly the (kind, from, to) triples listed in this module (the
    seed's and the few beyond it), nothing more."""
    assert {(str(kind), str(source), str(target)) for kind, source, target in EVENT_TRANSITIONS} == (
        CONTRACT_ALLOWLIST | BEYOND_THE_SEED
    )


def test_valid_state_tokens_are_the_request_states_absent_and_the_policy_states() -> None:
    """The journal's state tokens are the 12 request states, `absent`, `policy_steady` and
    `policy_soft_draining_to_1`, and (beyond the seed) `untrusted` and `retained` of an untrusted recovery row,
    `admitting` and the three kinds of paused scope (never a lane, provider or model name), and the budget
    states (never a key or an amount)."""
    assert {str(state) for state in EVENT_STATES} == REQUEST_STATES | {
        "absent",
        "policy_steady",
        "policy_soft_draining_to_1",
        "untrusted",
        "retained",
        "admitting",
        "paused_all",
        "paused_lane",
        "paused_key",
        "uncharged",
        "reserved",
        "reconciled",
        "charged",
        "refunded",
        "outside_plane",
        "external",
        "correction",
    }


@pytest.mark.parametrize("transition", sorted(CONTRACT_ALLOWLIST | BEYOND_THE_SEED), ids="/".join)
def test_every_allowlisted_transition_reads_back(
    plane: AdmissionPlane, database_url: str, transition: tuple[str, str, str]
) -> None:
    """A well-formed stored event of any allowlisted transition passes the checks on read."""
    execute(
        database_url,
        "INSERT INTO events (kind, from_state, to_state, occurred_at, correlation_hmac) VALUES (?, ?, ?, 5, ?)",
        params=(*transition, CORRELATION_REQUEST_1),
    )
    [event] = read_all(plane)
    assert (event.kind, event.from_state, event.to_state, event.occurred_at) == (*transition, 5)


@pytest.mark.parametrize(
    "transition",
    [
        ("request_released", "provider_terminal", "queue_timeout"),
        ("request_cancelled", "admitted", "cancelled"),
        ("request_abandoned", "active", "failed"),
        ("request_abandoned", "admitted", "completed"),
        ("policy_drain_completed", "policy_steady", "policy_soft_draining_to_1"),
    ],
    ids="/".join,
)
def test_the_writer_refuses_a_transition_outside_the_allowlist(
    plane: AdmissionPlane, database_url: str, transition: tuple[str, str, str]
) -> None:
    """The journal writer refuses a transition outside the allowlist with `admission event transition is not
    allowlisted` and the transaction rolls back."""
    enqueue(plane, "request-1", now=100)
    before = table_dump(database_url)

    def work(tx):  # type: ignore[no-untyped-def]
        tx.execute(Statement(text("UPDATE turn_requests SET state = 'cancelled'")))
        _journal.record(plane._ctx, tx, *transition[:1], "request-1", *transition[1:], 101)

    with pytest.raises(AdmissionStateError, match=exactly("admission event transition is not allowlisted")):
        plane._ctx.run(work)
    assert table_dump(database_url) == before
    assert count(database_url, "events") == 1
