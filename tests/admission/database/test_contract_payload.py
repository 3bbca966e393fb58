"""Payload encryption at rest, expiry, row binding, key separation and lifetime."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from dbutil import count, exactly, execute, query, table_dump
from planes import PlaneFactory, admit, dispatch_record, enqueue

from admission_plane import (
    AdmissionPlane,
    AdmissionStateError,
    LiveTurnCompletion,
    PayloadExpiredError,
    PayloadIntegrityError,
)
from admission_plane.migrate import upgrade

NO_PAYLOAD = "no payload is available"
SENTINEL = "SENTINEL-PROMPT-3f9a1c-é-漢字"
META = {
    "session_id": "SENTINEL-SESSION-51c2",
    "agent_id": "SENTINEL-AGENT-8e0d",
    "fingerprint": "SENTINEL-FINGERPRINT-22ab",
    "provider": "SENTINEL-PROVIDER-7d41",
    "model": "SENTINEL-MODEL-90fe",
}


def database_files(path: str) -> dict[str, bytes]:
    """The main database file and whichever of its -wal/-shm files exist."""
    return {suffix: Path(path + suffix).read_bytes() for suffix in ("", "-wal", "-shm") if Path(path + suffix).exists()}


def payload_count(path: str, request_id: str) -> int:
    return count(path, "turn_payloads", "request_id = ?", (request_id,))


def assert_no_payload(plane: AdmissionPlane, path: str, request_id: str, now: int) -> None:
    assert payload_count(path, request_id) == 0
    with pytest.raises(AdmissionStateError, match=exactly(NO_PAYLOAD)):
        plane.read_payload(request_id, now)


# --- ciphertext at rest, nothing sensitive on disk ---------------------------------------------------------


def test_persisted_payload_reads_back_as_plaintext(plane: AdmissionPlane) -> None:
    """read_payload before expiry returns exactly the persisted prompt."""
    plane.enqueue(request_id="sealed", **META, now=0)
    plane.persist_payload("sealed", SENTINEL, 0, 1_000)
    assert plane.read_payload("sealed", 999) == SENTINEL


def test_payload_row_holds_only_ciphertext_of_the_plaintext_length(plane: AdmissionPlane, database_url: str) -> None:
    """A payload row holds a 12-byte nonce, a ciphertext as long as the UTF-8 prompt, a 16-byte tag and key version 1,
    never the prompt."""
    enqueue(plane, "sealed", now=0, plaintext=SENTINEL)
    [(nonce, ciphertext, tag, key_version)] = query(
        database_url, "SELECT nonce, ciphertext, auth_tag, key_version FROM turn_payloads"
    )
    assert (len(nonce), len(ciphertext), len(tag), key_version) == (12, len(SENTINEL.encode()), 16, 1)
    assert ciphertext != SENTINEL.encode()


def admitted_sentinel(make_plane: PlaneFactory) -> tuple[AdmissionPlane, bytes, bytes]:
    """A plane with fresh random keys whose sentinel prompt is queued and admitted; the plane and both keys."""
    encryption_key, content_key = os.urandom(32), os.urandom(32)
    plane = make_plane(encryption_key=encryption_key, content_fingerprint_key=content_key)
    plane.enqueue_with_payload(request_id="SENTINEL-REQUEST-4b6e", **META, now=0, plaintext=SENTINEL, expires_at=10_000)
    admit(plane, 1)
    return plane, encryption_key, content_key


@pytest.mark.sqlite_only("reads the bytes of the database, -wal and -shm files")
def test_plaintext_and_metadata_appear_in_no_database_file(make_plane: PlaneFactory, database_url: str) -> None:
    """The prompt bytes and the raw key bytes appear in none of the SQLite database, -wal and -shm files."""
    plane, encryption_key, content_key = admitted_sentinel(make_plane)
    assert plane.read_payload("SENTINEL-REQUEST-4b6e", 2) == SENTINEL
    files = database_files(database_url)
    assert "-wal" in files
    for secret in (SENTINEL.encode(), encryption_key, content_key):
        assert all(secret not in data for data in files.values())


def test_no_stored_value_holds_the_prompt_or_a_key(make_plane: PlaneFactory, database_url: str) -> None:
    """No column of any table holds the prompt bytes or either raw key, on either dialect."""
    _plane, encryption_key, content_key = admitted_sentinel(make_plane)
    stored = [
        value.encode() if isinstance(value, str) else value
        for rows in table_dump(database_url).values()
        for row in rows
        for value in row
        if isinstance(value, str | bytes)
    ]
    for secret in (SENTINEL.encode(), encryption_key, content_key):
        assert all(secret not in value for value in stored)


def test_journal_rows_carry_no_identifier_or_prompt(plane: AdmissionPlane, database_url: str) -> None:
    """Journal events hold kinds, states, times and an HMAC, never a request id or the prompt."""
    plane.enqueue_with_payload(request_id="SENTINEL-REQUEST-4b6e", **META, now=0, plaintext=SENTINEL, expires_at=10_000)
    admit(plane, 1)
    journal = repr(query(database_url, "SELECT * FROM events")) + repr(plane.read_sanitized_events())
    assert "SENTINEL" not in journal
    assert len(query(database_url, "SELECT * FROM events")) == 2


# --- expiry on read --------------------------------------------------------------------------------------


def test_reading_at_expiry_deletes_the_payload_and_raises_expired(plane: AdmissionPlane, database_url: str) -> None:
    """Reading at or after expires_at durably deletes the payload and raises PayloadExpiredError, naming no request."""
    enqueue(plane, "expiring", now=0, expires_at=100)
    with pytest.raises(PayloadExpiredError, match=exactly("request payload has expired")) as raised:
        plane.read_payload("expiring", 100)
    assert "expiring" not in str(raised.value)
    assert payload_count(database_url, "expiring") == 0


def test_the_read_after_an_expired_read_finds_no_payload(plane: AdmissionPlane) -> None:
    """Once an expired payload has been deleted, the next read raises `no payload is available`."""
    enqueue(plane, "expiring", now=0, expires_at=100)
    with pytest.raises(PayloadExpiredError):
        plane.read_payload("expiring", 150)
    with pytest.raises(AdmissionStateError, match=exactly(NO_PAYLOAD)):
        plane.read_payload("expiring", 150)


def test_reading_just_before_expiry_succeeds_and_keeps_the_row(plane: AdmissionPlane, database_url: str) -> None:
    """One millisecond before expires_at the payload reads back and its row stays."""
    enqueue(plane, "expiring", now=0, expires_at=100)
    before = table_dump(database_url)
    assert plane.read_payload("expiring", 99) == "prompt for expiring"
    assert table_dump(database_url) == before


def test_reads_do_not_check_the_request_state(plane: AdmissionPlane) -> None:
    """A payload is readable whatever the request's state, here admitted."""
    enqueue(plane, "admitted", now=0)
    admit(plane, 1)
    assert plane.read_payload("admitted", 2) == "prompt for admitted"


def test_reading_an_unknown_request_finds_no_payload(plane: AdmissionPlane, database_url: str) -> None:
    """Reading a request that never had a payload raises `no payload is available` and writes nothing."""
    before = table_dump(database_url)
    with pytest.raises(AdmissionStateError, match=exactly(NO_PAYLOAD)):
        plane.read_payload("ghost", 0)
    assert table_dump(database_url) == before


# --- row binding through the AAD -------------------------------------------------------------------------------


def test_swapping_sealed_payloads_between_two_rows_fails_both_reads(plane: AdmissionPlane, database_url: str) -> None:
    """Exchanging the nonce, ciphertext and tag between two requests' rows makes both reads fail authentication."""
    enqueue(plane, "row-a", now=0, plaintext="same prompt")
    enqueue(plane, "row-b", now=0, plaintext="same prompt")
    rows = query(database_url, "SELECT request_id, nonce, ciphertext, auth_tag FROM turn_payloads")
    sealed = {row[0]: row[1:] for row in rows}
    for target, source in (("row-a", "row-b"), ("row-b", "row-a")):
        execute(
            database_url,
            "UPDATE turn_payloads SET nonce = ?, ciphertext = ?, auth_tag = ? WHERE request_id = ?",
            params=(*sealed[source], target),
        )
    for request_id in ("row-a", "row-b"):
        with pytest.raises(PayloadIntegrityError, match=exactly("request payload failed authentication")):
            plane.read_payload(request_id, 1)


@pytest.mark.parametrize("column", ["nonce", "ciphertext", "auth_tag"])
def test_a_flipped_byte_in_any_sealed_column_fails_authentication(
    plane: AdmissionPlane, database_url: str, column: str
) -> None:
    """Changing one byte of the nonce, ciphertext or tag makes the read fail with PayloadIntegrityError."""
    enqueue(plane, "tampered", now=0)
    [(value,)] = query(database_url, f"SELECT {column} FROM turn_payloads")
    execute(database_url, f"UPDATE turn_payloads SET {column} = ?", params=(bytes([value[0] ^ 1]) + value[1:],))
    with pytest.raises(PayloadIntegrityError):
        plane.read_payload("tampered", 1)


def test_a_changed_key_version_fails_authentication(plane: AdmissionPlane, database_url: str) -> None:
    """The key version is part of the authenticated data, so rewriting it makes the read fail."""
    enqueue(plane, "tampered", now=0)
    execute(database_url, "UPDATE turn_payloads SET key_version = 2")
    with pytest.raises(PayloadIntegrityError):
        plane.read_payload("tampered", 1)


def test_a_payload_sealed_under_another_encryption_key_fails_authentication(make_plane: PlaneFactory) -> None:
    """A plane holding a different encryption key cannot open the payload."""
    enqueue(make_plane(), "sealed", now=0)
    with pytest.raises(PayloadIntegrityError):
        make_plane(encryption_key=bytes([9]) * 32).read_payload("sealed", 1)


# --- key separation -------------------------------------------------------------------------------------------


def test_content_fingerprints_differ_under_different_content_keys(
    make_plane: PlaneFactory, database_url: str, tmp_path: Path
) -> None:
    """The same request id and prompt under two content keys store different content fingerprints."""
    other_database = str(tmp_path / "other.sqlite")
    upgrade(other_database)
    enqueue(make_plane(), "same", now=0, plaintext="same prompt")
    enqueue(
        make_plane(database=other_database, content_fingerprint_key=bytes([3]) * 32),
        "same",
        now=0,
        plaintext="same prompt",
    )
    fingerprints = {
        query(path, "SELECT content_fingerprint FROM turn_payloads")[0][0] for path in (database_url, other_database)
    }
    assert len(fingerprints) == 2


def test_event_correlation_differs_from_the_content_fingerprint(plane: AdmissionPlane, database_url: str) -> None:
    """The journal's correlation HMAC of a request differs from its payload's content fingerprint."""
    enqueue(plane, "same", now=0)
    [(fingerprint,)] = query(database_url, "SELECT content_fingerprint FROM turn_payloads")
    [(correlation,)] = query(database_url, "SELECT correlation_hmac FROM events")
    assert fingerprint != correlation


# --- payload lifetime --------------------------------------------------------------------------------------------


def test_payload_survives_admission_start_and_dispatch_intent(plane: AdmissionPlane) -> None:
    """The prompt stays readable while the lease is admitted, starting and in dispatch_intent."""
    enqueue(plane, "kept", now=0)
    lease = admit(plane, 1)
    assert plane.read_payload("kept", 1) == "prompt for kept"
    plane.mark_starting(lease, 2)
    assert plane.read_payload("kept", 2) == "prompt for kept"
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    assert plane.read_payload("kept", 3) == "prompt for kept"


def test_dispatch_ambiguous_keeps_the_payload(plane: AdmissionPlane, database_url: str) -> None:
    """mark_dispatch_ambiguous does not delete the payload."""
    enqueue(plane, "ambiguous", now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 2)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    plane.mark_dispatch_ambiguous(lease, 4)
    assert payload_count(database_url, "ambiguous") == 1
    assert plane.read_payload("ambiguous", 5) == "prompt for ambiguous"


def to_dispatch_intent(plane: AdmissionPlane, request_id: str):
    enqueue(plane, request_id, now=0)
    lease = admit(plane, 1)
    plane.mark_starting(lease, 2)
    assert plane.commit_dispatch_intent(dispatch_record(plane, lease)).ok
    return lease


def to_active(plane: AdmissionPlane, request_id: str):
    lease = to_dispatch_intent(plane, request_id)
    plane.mark_active(lease, 4)
    return lease


def mark_active(plane: AdmissionPlane, request_id: str) -> None:
    to_active(plane, request_id)


def cancel_queued(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    plane.cancel_queued(request_id, 5)


def queue_timeout(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    assert plane.get_queue_snapshot(request_id, plane.policy.queue_timeout_ms) is None


def abandon_before_prompt(plane: AdmissionPlane, request_id: str) -> None:
    plane.abandon_before_prompt(to_dispatch_intent(plane, request_id), 5, "cancelled")


def execution_recovery_required(plane: AdmissionPlane, request_id: str) -> None:
    plane.mark_execution_recovery_required(to_dispatch_intent(plane, request_id), 5)


def release_exited_recovery_seat(plane: AdmissionPlane, request_id: str) -> None:
    plane.release_exited_recovery_seat(to_dispatch_intent(plane, request_id), 5)


def complete_live_turn(plane: AdmissionPlane, request_id: str) -> None:
    plane.complete_live_turn(to_active(plane, request_id), 5, LiveTurnCompletion("completed"))


def settle_queued_owner_death(plane: AdmissionPlane, request_id: str) -> None:
    enqueue(plane, request_id, now=0)
    assert plane.settle_queued_owner_death(request_id, plane.owner_identity.owner_instance_id, 5)


DELETING_PATHS: dict[str, Callable[[AdmissionPlane, str], None]] = {
    "mark_active": mark_active,
    "cancel_queued": cancel_queued,
    "queue_timeout": queue_timeout,
    "abandon_before_prompt": abandon_before_prompt,
    "mark_execution_recovery_required": execution_recovery_required,
    "release_exited_recovery_seat": release_exited_recovery_seat,
    "complete_live_turn": complete_live_turn,
    "settle_queued_owner_death": settle_queued_owner_death,
}


@pytest.mark.parametrize("path", DELETING_PATHS)
def test_payload_is_deleted_by_every_path_past_the_prompt_or_out_of_the_queue(
    plane: AdmissionPlane, database_url: str, path: str
) -> None:
    """Activation, cancel, queue timeout, abandonment, execution recovery, recovery seat release, completion and
    settling a dead owner each delete the payload."""
    DELETING_PATHS[path](plane, "gone")
    assert_no_payload(plane, database_url, "gone", 6)


def test_recovery_required_entered_from_active_has_no_payload(plane: AdmissionPlane, database_url: str) -> None:
    """A lease moved to recovery_required after activation has no payload."""
    lease = to_active(plane, "active")
    plane.mark_execution_recovery_required(lease, 5)
    assert_no_payload(plane, database_url, "active", 6)


# --- admission ignores payload expiry -----------------------------------------------------------------------------


def test_expired_but_unread_payload_does_not_block_admission(plane: AdmissionPlane) -> None:
    """Admission needs only a payload row, so a request whose payload has expired unread is still admitted."""
    enqueue(plane, "stale-payload", now=0, expires_at=10)
    assert admit(plane, 500).request_id == "stale-payload"


def test_the_read_after_admitting_an_expired_payload_fails(plane: AdmissionPlane, database_url: str) -> None:
    """Reading an admitted request's expired payload raises PayloadExpiredError and deletes the row."""
    enqueue(plane, "stale-payload", now=0, expires_at=10)
    admit(plane, 500)
    with pytest.raises(PayloadExpiredError):
        plane.read_payload("stale-payload", 501)
    assert payload_count(database_url, "stale-payload") == 0
